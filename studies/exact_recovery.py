"""Does one Lie–Trotter step of size 1 per layer recover published Transformers exactly?

For each architecture — `torch.nn.TransformerEncoder` post-LN (ReLU) and pre-LN (GELU), Hugging
Face BERT and GPT-2, and paper A's literal substep scheme — and a few sizes, random weights are
loaded into the workbench equation and the output is compared with (a) the PyTorch / Hugging Face
model holding the same weights (when the `reference` extra is installed) and (b) the workbench's
own direct layer-by-layer NumPy implementation (always), in float32 and float64. Acceptance:
max abs error ≤ 1e-4 in float32 and ≤ 1e-10 in float64.
"""

import dataclasses
import pathlib

import equinox as eqx
import jax
import numpy as np

import workbench as wb

NAME = "exact-recovery"
SUMMARY = "Max abs error of the recovered encoder, BERT, GPT-2 and paper A vs PyTorch/HF and NumPy."

ARCHITECTURES = ("encoder-post-relu", "encoder-pre-gelu", "bert", "gpt2", "paper-a")
TOLERANCE = {"float32": 1e-4, "float64": 1e-10}


@dataclasses.dataclass(frozen=True)
class Config:
    architectures: tuple[str, ...] = ARCHITECTURES
    widths: tuple[int, ...] = (12, 36, 64)
    """Model widths d; 12 and 36 are not divisible by 8."""
    num_layers: int = 4
    seq_len: int = 32
    dtypes: tuple[str, ...] = ("float32", "float64")
    seed: int = 0


def smoke_config() -> Config:
    return Config(widths=(12, 20), num_layers=2, seq_len=8)


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


def main(config: Config, out: pathlib.Path) -> dict:
    for name in config.architectures:
        if name not in ARCHITECTURES:
            raise ValueError(
                f"architectures: {name!r} is not known; valid: {', '.join(ARCHITECTURES)}."
            )
    for name in config.dtypes:
        if name not in TOLERANCE:
            raise ValueError(f"dtypes: {name!r} is not known; valid: float32, float64.")
    if "float64" in config.dtypes and not jax.config.jax_enable_x64:
        raise ValueError(
            "dtypes includes float64 but jax_enable_x64 is off; run via `workbench run`."
        )
    have_ref = wb.architectures.have_reference()
    rng = np.random.default_rng(config.seed)
    cases = [(a, d, t) for a in config.architectures for d in config.widths for t in config.dtypes]
    rows = []
    for arch, d, dtype in wb.report.progress(cases, desc="exact-recovery"):
        ours, direct, reference = _case(arch, d, config, np.dtype(dtype).type, rng)
        rows.append(
            {
                "architecture": arch,
                "d": d,
                "heads": _heads(d),
                "dtype": dtype,
                "error_vs_direct": float(np.max(np.abs(ours - direct))),
                "error_vs_reference": None
                if reference is None
                else float(np.max(np.abs(ours - reference))),
                "tolerance": TOLERANCE[dtype],
            }
        )
    for r in rows:
        errs = [e for e in (r["error_vs_direct"], r["error_vs_reference"]) if e is not None]
        r["pass"] = all(e <= r["tolerance"] for e in errs)
    all_pass = all(r["pass"] for r in rows)
    if wb.report.have_matplotlib():
        _plot(rows, config, out / "errors.png")
    table = wb.report.markdown_table(
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
                r["architecture"],
                r["d"],
                r["heads"],
                r["dtype"],
                "n/a" if r["error_vs_reference"] is None else f"{r['error_vs_reference']:.2e}",
                f"{r['error_vs_direct']:.2e}",
                f"{r['tolerance']:.0e}",
                "yes" if r["pass"] else "NO",
            ]
            for r in rows
        ],
    )
    ref_note = (
        "PyTorch / Hugging Face reference: installed."
        if have_ref
        else "PyTorch / Hugging Face reference: **not installed** (`pip install 'workbench[reference]'`); "
        "only the NumPy comparison ran."
    )
    report = (
        f"Lie–Trotter, τ = 1, explicit Euler substeps; {config.num_layers} layers, n = {config.seq_len}. "
        f"{ref_note}\n\n{table}\n\n"
        f"**{'All' if all_pass else 'NOT all'} {len(rows)} cases within tolerance** "
        f"(float32 ≤ 1e-4, float64 ≤ 1e-10).\n"
    )
    return {"cases": rows, "all_pass": all_pass, "reference_installed": have_ref, "report": report}


def _plot(rows, config, path):
    fig, axes = wb.report.new_figure(
        1, len(config.dtypes), figsize=(5.5 * len(config.dtypes), 4), squeeze=False
    )
    for ax, dtype in zip(axes[0], config.dtypes):
        sub = [r for r in rows if r["dtype"] == dtype]
        labels = [f"{r['architecture']}\nd={r['d']}" for r in sub]
        x = np.arange(len(sub))
        floor = np.finfo(np.dtype(dtype)).tiny
        ax.bar(
            x - 0.2, [max(r["error_vs_direct"], floor) for r in sub], 0.4, label="vs direct NumPy"
        )
        if any(r["error_vs_reference"] is not None for r in sub):
            ax.bar(
                x + 0.2,
                [max(r["error_vs_reference"] or floor, floor) for r in sub],
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
    wb.report.save_figure(fig, path)
