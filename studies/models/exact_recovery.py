"""Does one Lie–Trotter step of size 1 per layer recover published Transformers exactly?

For each architecture — `torch.nn.TransformerEncoder` post-LN (ReLU) and pre-LN (GELU), Hugging
Face BERT, GPT-2, ViT and CvT, and paper A's literal substep scheme — and a few sizes, random
weights are loaded into the workbench equation and the output is compared with (a) the PyTorch /
Hugging Face model holding the same weights (when the `reference` extra is installed) and (b) the
workbench's own direct layer-by-layer NumPy implementation (always), in float32 and float64.
Acceptance: max abs error ≤ 1e-4 in float32 and ≤ 1e-10 in float64.

The text models read `seq_len` tokens; the vision models take one random image of a fixed size:
ViT a non-square `VIT_IMAGE` in `VIT_PATCH` patches (`last_hidden_state[0]`, class token first),
CvT two stages of widths `(d, 2d)` on `CVT_IMAGE` (the last stage's grid tokens and its class
token, compared as one array).
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import numpy as np

import workbench as wb
from studies._toolkit.config import check, check_choices, check_nonempty, check_positive, check_seed
from studies._toolkit.report import markdown_table, new_figure, progress

NAME = "exact-recovery"
SUMMARY = (
    "Paper A's exact recovery: encoder, BERT, GPT-2, ViT, CvT and its literal scheme vs "
    "PyTorch/HF and NumPy."
)

ARCHITECTURES = ("encoder-post-relu", "encoder-pre-gelu", "bert", "gpt2", "vit", "cvt", "paper-a")
TOLERANCE = {"float32": 1e-4, "float64": 1e-10}
VIT_IMAGE, VIT_PATCH = (12, 8), (4, 4)
"""ViT image `(rows, cols)` and patch: a 3 × 2 grid of patches, 7 tokens with the class token."""
CVT_IMAGE = (24, 20)
"""CvT image `(rows, cols)`: stage grids 6 × 5 and 3 × 3 (the last with a class token)."""


@dataclasses.dataclass(frozen=True)
class Config:
    architectures: tuple[str, ...] = ARCHITECTURES
    """Architectures to recover, one case per architecture, width and dtype."""
    widths: tuple[int, ...] = (12, 36, 64)
    """Model widths d; 12 and 36 are not divisible by 8."""
    num_layers: int = 4
    """Layers per model; CvT splits them over its two stages (at least 1 and 2)."""
    seq_len: int = 32
    """Tokens per sequence of the text models (encoders, BERT, GPT-2, paper A); ViT and CvT
    take one image of their own fixed size (`VIT_IMAGE`, `CVT_IMAGE`)."""
    dtypes: tuple[str, ...] = ("float32", "float64")
    """Precisions to compare in, each with its own tolerance (1e-4 float32, 1e-10 float64)."""
    seed: int = 0
    """Seeds the random weights and inputs."""

    def __post_init__(self):
        check_nonempty(self, "architectures", "widths", "dtypes")
        check_choices(self, "architectures", ARCHITECTURES)
        check_choices(self, "dtypes", tuple(TOLERANCE))
        check_positive(self, "num_layers", "seq_len")
        check(self, "widths", all(d >= 3 for d in self.widths), "every width d must be >= 3")
        check_seed(self)

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory`), one case (architecture, width,
        dtype) at a time, the largest: three copies of the model's parameters (the random state
        dict, the workbench model, the PyTorch / Hugging Face reference; `num_layers` layers of
        width `e` with a feed-forward of at most `4·e`, `e = 2·d` in CvT's second stage, plus BERT's
        and GPT-2's 97-token vocabulary and position rows) and three forward passes' activations of
        one layer on the case's tokens (`seq_len` for the text models, 7 for ViT, 30 for CvT), in
        float64 when `dtypes` holds it."""
        from studies._toolkit import memory as M

        item = M.F64 if "float64" in self.dtypes else M.F32

        def case(arch: str, d: int) -> int:
            e = 2 * d if arch == "cvt" else d
            tokens = {"vit": 7, "cvt": 30}.get(arch, self.seq_len)  # VIT_IMAGE, CVT_IMAGE
            rows = 97 + max(64, self.seq_len) + 2 if arch in ("bert", "gpt2") else tokens
            params = M.encoder_parameters(e, 4 * e, self.num_layers, vocab=rows)
            layer = M.attention_layer_floats(tokens, e, 4 * e, 8)
            return item * 3 * (params + layer)

        return max(case(a, d) for a in self.architectures for d in self.widths)


def smoke_config() -> Config:
    return Config(widths=(12,), num_layers=2, seq_len=8)


@dataclasses.dataclass(frozen=True)
class Case:
    architecture: str
    d: int
    heads: int
    dtype: str
    error_vs_direct: float
    """Max abs difference to the workbench's direct layer-by-layer NumPy implementation."""
    error_vs_reference: float | None
    """Max abs difference to PyTorch / Hugging Face; `None` when the reference did not run."""
    tolerance: float

    @property
    def passed(self) -> bool:
        errs = [e for e in (self.error_vs_direct, self.error_vs_reference) if e is not None]
        return all(e <= self.tolerance for e in errs)


@dataclasses.dataclass(frozen=True)
class Results:
    config: Config
    cases: tuple[Case, ...]
    reference_installed: bool
    """Whether torch / transformers were importable, i.e. whether the reference comparison ran."""


def _heads(d: int) -> int:
    return next(h for h in (8, 4, 3, 2, 1) if d % h == 0 and d // h >= 3)


def _case(arch: str, d: int, cfg: Config, dtype, rng):
    """(workbench output, direct NumPy output, reference or None) for one configuration."""
    A = wb.architectures
    H, L, n = _heads(d), cfg.num_layers, cfg.seq_len
    ref = A.have_reference()
    if arch.startswith("encoder"):
        norm_first, act = (False, "relu") if arch == "encoder-post-relu" else (True, "gelu")
        sd = A.random_encoder_state_dict(
            rng, d=d, num_layers=L, dim_feedforward=2 * d + 4, final_norm=norm_first, dtype=dtype
        )
        u = rng.standard_normal((n, d)).astype(dtype)
        m = A.encoder_from_torch(sd, num_heads=H, norm_first=norm_first, activation=act)
        ours = np.asarray(eqx.filter_jit(m)(u))
        direct = A.direct_encoder(sd, u, num_heads=H, norm_first=norm_first, activation=act)
        reference = (
            A.run_reference(
                A.torch_encoder(
                    sd, num_heads=H, norm_first=norm_first, activation=act, dtype=dtype
                ),
                u,
            )
            if ref
            else None
        )
    elif arch == "bert":
        config = A.bert_config(
            d=d, num_heads=H, num_layers=L, intermediate=3 * d, positions=max(64, n)
        )
        sd = A.random_bert_state_dict(rng, config, dtype=dtype)
        ids, types = rng.integers(0, config["vocab_size"], n), rng.integers(0, 2, n)
        ours = np.asarray(eqx.filter_jit(A.bert_from_hf(sd, config))(ids, types))
        direct = A.direct_bert(sd, config, ids, types)
        reference = (
            A.run_reference(A.hf_bert(sd, config, dtype=dtype), ids, token_type_ids=types)
            if ref
            else None
        )
    elif arch == "gpt2":
        config = A.gpt2_config(d=d, num_heads=H, num_layers=L, positions=max(64, n))
        sd = A.random_gpt2_state_dict(rng, config, dtype=dtype)
        ids = rng.integers(0, config["vocab_size"], n)
        ours = np.asarray(eqx.filter_jit(A.gpt2_from_hf(sd, config))(ids))
        direct = A.direct_gpt2(sd, config, ids)
        reference = A.run_reference(A.hf_gpt2(sd, config, dtype=dtype), ids) if ref else None
    elif arch == "vit":
        config = A.vit_config(
            d=d,
            num_heads=H,
            num_layers=L,
            intermediate=2 * d + 4,
            image_size=VIT_IMAGE,
            patch_size=VIT_PATCH,
        )
        sd = A.random_vit_state_dict(rng, config, dtype=dtype)
        image = rng.standard_normal((config["num_channels"], *VIT_IMAGE)).astype(dtype)
        ours = np.asarray(eqx.filter_jit(A.vit_from_hf(sd, config))(image))
        direct = A.direct_vit(sd, config, image)
        reference = A.run_reference(A.hf_vit(sd, config, dtype=dtype), image) if ref else None
    elif arch == "cvt":
        # Hugging Face's CvtStage indexes its drop-path rates by the stage: depth[1] >= 2.
        depth = (max(1, L // 2), max(2, L - L // 2))
        config = A.cvt_config(embed_dim=(d, 2 * d), num_heads=(H, H), depth=depth)
        sd = A.random_cvt_state_dict(rng, config, dtype=dtype)
        image = rng.standard_normal((config["num_channels"], *CVT_IMAGE)).astype(dtype)
        # One array per model: the last stage's grid tokens, then its class token.
        joined = lambda out: np.concatenate([np.asarray(out[0]), np.asarray(out[1])[None]])
        ours = joined(eqx.filter_jit(A.cvt_from_hf(sd, config, image_size=CVT_IMAGE))(image))
        direct = joined(A.direct_cvt(sd, config, image))
        reference = _hf_cvt_output(A.hf_cvt(sd, config, dtype=dtype), image) if ref else None
    elif arch == "paper-a":
        model = A.PaperAEncoder.random(rng, d=d, num_heads=H, num_layers=L, dtype=dtype)
        u = rng.standard_normal((n, d)).astype(dtype)
        ours = np.asarray(eqx.filter_jit(model)(u))
        # Its "direct" counterpart is the standard post-LN block with W̃ = I + W (eps = 0).
        direct = np.asarray(eqx.filter_jit(model.post_ln_equivalent())(u))
        reference = None
        if ref:
            sd = model.post_ln_state_dict()
            reference = A.run_reference(
                A.torch_encoder(sd, num_heads=H, layer_norm_eps=0.0, dtype=dtype), u
            )
    else:
        raise ValueError(f"architecture={arch!r}; valid: {', '.join(ARCHITECTURES)}.")
    return ours, direct, reference


def _hf_cvt_output(model, image) -> np.ndarray:
    """`CvtModel` on one image: `last_hidden_state[0]` `(d, rows, cols)` as tokens
    `(rows · cols, d)` in row-major order, then `cls_token_value[0, 0]`."""
    import torch

    with torch.inference_mode():
        out = model(torch.as_tensor(image)[None])
    x = out.last_hidden_state[0].numpy()
    return np.concatenate([x.reshape(x.shape[0], -1).T, out.cls_token_value[0].numpy()])


def _max_error(ours, other) -> float:
    """Max abs difference of two outputs of the same shape (no broadcasting)."""
    if np.shape(ours) != np.shape(other):
        raise ValueError(f"output shapes differ: {np.shape(ours)} vs {np.shape(other)}")
    return float(np.max(np.abs(ours - other)))


def compute(config: Config) -> Results:
    """Load random weights into every architecture, width and dtype of `config` and compare."""
    have_ref = wb.architectures.have_reference()
    rng = np.random.default_rng(config.seed)
    cases = [(a, d, t) for a in config.architectures for d in config.widths for t in config.dtypes]
    rows = []
    with jax.enable_x64("float64" in config.dtypes):
        for arch, d, dtype in progress(cases, desc=NAME):
            ours, direct, reference = _case(arch, d, config, np.dtype(dtype).type, rng)
            rows.append(
                Case(
                    architecture=arch,
                    d=d,
                    heads=_heads(d),
                    dtype=dtype,
                    error_vs_direct=_max_error(ours, direct),
                    error_vs_reference=None if reference is None else _max_error(ours, reference),
                    tolerance=TOLERANCE[dtype],
                )
            )
    return Results(config=config, cases=tuple(rows), reference_installed=have_ref)


def verdict(results: Results) -> str:
    """Yes only if every case is within its tolerance against both the direct NumPy forward and
    PyTorch / Hugging Face; without the reference the answer is at most "Partly"."""
    cases = results.cases
    failed = [r for r in cases if not r.passed]
    worst = {
        dtype: max(
            max(r.error_vs_direct, r.error_vs_reference or 0.0) for r in cases if r.dtype == dtype
        )
        for dtype in results.config.dtypes
    }
    numbers = "; ".join(
        f"{dtype}: worst {err:.1e} (tolerance {TOLERANCE[dtype]:.0e})"
        for dtype, err in worst.items()
    )
    if failed:
        where = ", ".join(f"{r.architecture} d={r.d} {r.dtype}" for r in failed)
        return (
            f"No. {len(failed)} of {len(cases)} cases exceed their tolerance ({where}); {numbers}."
        )
    if not results.reference_installed:
        return (
            f"Partly. PyTorch/HF reference not run (install `workbench[reference]`): all {len(cases)} "
            f"cases agree with the direct NumPy implementation only; {numbers}."
        )
    return (
        f"Yes. All {len(cases)} cases agree with PyTorch / Hugging Face and with the direct NumPy "
        f"implementation; {numbers}."
    )


def report(results: Results) -> str:
    config = results.config
    table = markdown_table(
        [
            "architecture",
            "d",
            "heads",
            "dtype",
            "vs reference",
            "vs direct NumPy",
            "tolerance",
            "pass",
        ],
        [
            [
                r.architecture,
                r.d,
                r.heads,
                r.dtype,
                "not run" if r.error_vs_reference is None else f"{r.error_vs_reference:.2e}",
                f"{r.error_vs_direct:.2e}",
                f"{r.tolerance:.0e}",
                "yes" if r.passed else "NO",
            ]
            for r in results.cases
        ],
    )
    ref_note = (
        "PyTorch / Hugging Face reference: installed and run."
        if results.reference_installed
        else "PyTorch / Hugging Face reference: **not run** (not installed; "
        "`pip install 'workbench[reference]'`); only the NumPy comparison ran."
    )
    inputs = []
    if set(config.architectures) - {"vit", "cvt"}:
        inputs.append(f"n = {config.seq_len} tokens for the text models")
    if "vit" in config.architectures:
        inputs.append(f"ViT on one {_size(VIT_IMAGE)} image in {_size(VIT_PATCH)} patches")
    if "cvt" in config.architectures:
        inputs.append(
            f"CvT (two stages, widths d and 2d, the layers split over them) on one "
            f"{_size(CVT_IMAGE)} image, its class token compared with the grid tokens"
        )
    return (
        f"Lie–Trotter, τ = 1, explicit Euler substeps; {config.num_layers} layers; "
        f"{'; '.join(inputs)}. {ref_note}\n\n{table}\n"
    )


def _size(hw) -> str:
    return f"{hw[0]} × {hw[1]}"


def figures(results: Results) -> dict:
    return {"errors": _plot(results.cases, results.config)}


def _plot(rows, config):
    fig, axes = new_figure(
        1, len(config.dtypes), figsize=(5.5 * len(config.dtypes), 4), squeeze=False
    )
    for ax, dtype in zip(axes[0], config.dtypes):
        sub = [r for r in rows if r.dtype == dtype]
        labels = [f"{r.architecture}\nd={r.d}" for r in sub]
        x = np.arange(len(sub))
        floor = np.finfo(np.dtype(dtype)).tiny
        ax.bar(x - 0.2, [max(r.error_vs_direct, floor) for r in sub], 0.4, label="vs direct NumPy")
        if any(r.error_vs_reference is not None for r in sub):
            ax.bar(
                x + 0.2,
                [max(r.error_vs_reference or floor, floor) for r in sub],
                0.4,
                label="vs PyTorch / HF",
            )
        ax.axhline(
            TOLERANCE[dtype], color="k", ls="--", lw=1, label=f"tolerance {TOLERANCE[dtype]:.0e}"
        )
        ax.set_yscale("log")
        ax.set_xticks(x, labels, rotation=90, fontsize=6)
        ax.set_ylabel("max |workbench − reference|")
        ax.set_title(f"Exact recovery, {dtype}")
        ax.legend(fontsize=7)
    return fig
