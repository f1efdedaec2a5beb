"""Does linear stability theory predict which steps are stable: does the maximal stable step τ*
computed from each scheme's Butcher data match the τ* observed by integrating, on linear fields
with known spectra and on the linearization of a pre-norm Transformer?

1. **Linear fields with known spectra** (`J = S Λ S⁻¹`: real negative, complex and mixed
   spectra; two non-commuting decaying operators for the splittings): the predicted τ* (first
   exit of `τλ` from the region of `R`, from the Butcher data) against the observed one
   (bisection on the growth `‖U_N‖/‖U_0‖` of the integration by the method's own `step`).
2. **A random pre-norm encoder** (GELU): dense Jacobian spectra of attention, feed-forward and
   the full field at each layer along the trajectory (checked against matrix-free Arnoldi). The
   exact flow grows along the modes with `Re λ > 0`, so τ* concerns the decaying modes of the
   frozen-state linearization `v' = J(u_l) v`: the observation applies one step of the
   method's own `step` to each decaying eigenvector and reads its amplification factor with
   the left eigenvector (`wb.analysis.observed_modal_max_stable_step`). A growth trial over
   many steps cannot resolve τ* here: on a trained layer's non-normal Jacobian the projector
   onto the decaying modes leaks the growing ones back, and a mode near the imaginary axis is
   outgrown in the frame by slower decaying ones.
3. The local Lipschitz constant of attention (power iteration on `JᵀJ`) on layer-normed random
   inputs, max over samples, against the attention scale β and the sequence length n.
4. Finite-time Lyapunov exponents of the network's layer map (QR method) along the trajectory.

Method names: `unsplit-euler`, `unsplit-heun`, `unsplit-rk4` are the Runge–Kutta tableaux of
`workbench.schemes` applied to the whole field (`wb.registry.UNSPLIT_METHODS`; the observed step
runs their own `step`), not the diffrax solvers `euler`, `heun`, `rk4` of `wb.registry.ODE_SOLVERS`
(same tableaux); the splittings are `wb.registry.SPLITTING_SCHEMES`, and Tsit5 and Dopri5 in the
region plot are ODE solvers.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb
import workbench.analysis as wa
from studies._toolkit.config import (
    check,
    check_choices,
    check_nonempty,
    check_positive,
    check_range,
    check_seed,
)
from studies._toolkit.report import markdown_table, new_figure, progress
from studies._toolkit.trained import check_weights, is_run_folder, sizes, trained
from workbench.analysis._spectra import matrix_with_spectrum

NAME = "stability"
SUMMARY = "Stability regions vs Jacobian spectra, max stable steps, Lipschitz of attention, FTLEs."

UNSPLIT = ("unsplit-euler", "unsplit-heun", "unsplit-rk4")
SPLITTINGS = tuple(wb.registry.SPLITTING_SCHEMES)
REGION_RK = (*UNSPLIT, "tsit5", "dopri5")  # the last two: ODE solvers (diffrax)
SPLIT_CASE = "split (non-commuting)"


@dataclasses.dataclass(frozen=True)
class Config:
    methods: tuple[str, ...] = UNSPLIT
    """Unsplit Runge–Kutta methods checked on the linear fields and the model's linearization."""
    splittings: tuple[str, ...] = SPLITTINGS
    """Splitting schemes checked on two non-commuting linear operators."""
    linear_dim: int = 12
    """Size of the linear test fields (>= 4: it holds a complex pair)."""
    linear_steps: int = 4000
    """Steps per growth trial of the observed step (linear fields)."""
    growth: float = 1e3
    """Stable = ‖U_N‖/‖U_0‖ ≤ growth and a late growth rate ≤ the rate tolerance below."""
    linear_rate_tol: float = 1e-6
    """Largest accepted late growth rate per step (linear fields)."""
    amplification_tol: float = 1e-9
    """On the model's linearization a decaying mode is amplified when its observed factor
    `|r_i(τ)|` exceeds `1 + amplification_tol` (the round-off of `r_i` is about the condition
    number of the eigenvectors times 1e-16)."""
    linear_tolerance: float = 0.02
    """Acceptance: |observed τ* / predicted τ* − 1| on the linear fields."""
    model_tolerance: float = 0.05
    """Acceptance: the same on the model's linearization."""
    d: int = 16
    """Model width d of the random pre-norm encoder."""
    heads: int = 4
    """Attention heads per layer; must divide d."""
    layers: int = 4
    """Encoder layers."""
    dff: int = 32
    """Hidden width of the feed-forward block."""
    n: int = 8
    """Tokens n of the input state (also the length of the Lipschitz inputs at each β)."""
    krylov_dim: int = 64
    """Krylov subspace dimension of the Arnoldi check of the dense Jacobian spectra."""
    betas: tuple[float, ...] = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
    """Attention scales β at which attention's Lipschitz constant is estimated (n tokens)."""
    seq_lens: tuple[int, ...] = (2, 4, 8, 16, 32, 64)
    """Sequence lengths n at which attention's Lipschitz constant is estimated (the model's β)."""
    lipschitz_samples: int = 8
    """Layer-normed random inputs per Lipschitz estimate; the max over them is reported."""
    seed: int = 0
    """Seeds the linear test fields, the random weights and the inputs."""
    weights: str = "random"
    """The pre-norm model: `random` (a random encoder of the sizes above) or a training run's
    folder (`--weights runs/train-digits`: the trained equation, from the first `n` tokens of
    its first saved example input embedded; `d`, `heads`, `layers` and `dff` are then the
    trained model's)."""

    def __post_init__(self):
        check_choices(self, "methods", wb.registry.UNSPLIT_METHODS)
        check_choices(self, "splittings", wb.registry.SPLITTING_SCHEMES)
        check_nonempty(self, "methods", "betas", "seq_lens")
        check_positive(self, "linear_steps", "d", "heads", "layers", "dff", "n")
        check_positive(self, "krylov_dim", "betas", "seq_lens", "lipschitz_samples")
        check_positive(self, "linear_tolerance", "model_tolerance", "amplification_tol")
        check_positive(self, "linear_rate_tol", allow_zero=True)
        check_range(self, "linear_dim", 4)
        check_range(self, "growth", 1.0, low_open=True)
        divisors = [h for h in range(1, self.d + 1) if self.d % h == 0]
        check(self, "heads", self.d % self.heads == 0, f"it must divide d={self.d}: {divisors}")
        check_seed(self)
        check_weights(self, "weights", ("random",))

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory`, float64), dominated by the model's
        linearization at one layer, `N = n · d` unknowns: the dense Jacobian by `jax.jacfwd`
        (`N` tangents through one evaluation, the `N × N` matrix), its eigendecomposition and
        eigenvectors' inverse (complex: about `10·N²`), and the observed stable step (the
        Jacobian in complex, and one step of the method on the decaying eigenvectors, about
        `N/2`, with its largest Runge–Kutta stages); the Lyapunov exponents' `N × N` frame and
        the linear test fields (`linear_dim`) are smaller."""
        from studies._toolkit import memory as M

        d, dff, heads, layers = self.d, self.dff, self.heads, self.layers
        if is_run_folder(self.weights):
            z = sizes(self.weights)
            d, dff, heads, layers = z["d"], z["hidden"], z["heads"], z["layers"]
        size = self.n * d
        evaluation = M.attention_layer_floats(self.n, d, dff, heads)
        rk = max(wb.registry.UNSPLIT_METHODS[m].tableau.num_stages for m in self.methods)
        jacobian = M.array_bytes(size, evaluation) + M.array_bytes(10, size, size)
        trials = M.array_bytes(2 * size * size + 2 * (rk + 3) * size * -(-size // 2))
        linear = M.growth_trial_bytes(self.linear_dim, self.linear_dim)
        lipschitz = M.array_bytes(
            self.lipschitz_samples,
            4,
            M.attention_layer_floats(max(self.seq_lens), d, 0, heads),
        )
        params = M.array_bytes(3, M.encoder_parameters(d, dff, layers))
        return max(jacobian + trials, linear, lipschitz) + params  # one phase at a time


def smoke_config() -> Config:
    return Config(
        linear_dim=8,
        linear_steps=2000,
        d=8,
        heads=2,
        layers=2,
        dff=16,
        n=4,
        krylov_dim=24,
        splittings=("lie",),
        betas=(0.25, 4.0),
        seq_lens=(4,),
        lipschitz_samples=1,
    )


@dataclasses.dataclass(frozen=True)
class StepRow:
    """Predicted vs observed maximal stable step of one method on one case."""

    case: str
    method: str
    predicted: float
    observed: float
    rel_diff: float
    """observed / predicted − 1 (0 when both are inf, NaN when undefined)."""


@dataclasses.dataclass(frozen=True)
class Layer:
    """The model's linearization at the state entering one layer."""

    layer: int
    spectral_radius: dict[str, float]
    max_real: dict[str, float]
    min_real: dict[str, float]
    num_growing: int
    num_decaying: int
    arnoldi_rel_error: float
    steps: dict[str, StepRow]
    eigenvalues_real: dict[str, np.ndarray]
    eigenvalues_imag: dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Lipschitz:
    default_scale: float
    betas: np.ndarray
    vs_beta: np.ndarray
    seq_lens: np.ndarray
    vs_n: np.ndarray


@dataclasses.dataclass(frozen=True)
class Results:
    config: Config
    linear: list[StepRow]
    linear_max_abs_rel_diff: float
    """Over the unsplit methods on the linear fields (as computed; the verdict reads the rows)."""
    model: list[Layer]
    lipschitz: Lipschitz
    lyapunov_exponents: np.ndarray
    rk_regions: dict[str, np.ndarray]
    """Stability polynomial coefficients R(z) = Σ c_k z^k: the unsplit methods, Tsit5, Dopri5."""
    split_regions: dict[str, np.ndarray]
    """The same for the splittings (`name[inner method]`), commuting operators with λ_k = z/2."""


def _row(case: str, method: str, pred: float, obs: float) -> StepRow:
    if np.isinf(pred) and np.isinf(obs):
        rel = 0.0
    elif np.isfinite(pred) and pred > 0:
        rel = float((obs - pred) / pred)
    else:
        rel = float("nan")
    return StepRow(case, method, float(pred), float(obs), rel)


# ---------------------------------------------------------------------------------------------
# Computation


def _linear_cases(dim: int) -> dict[str, np.ndarray]:
    """Eigenvalue sets: real negative; complex pairs; mixed (real + near-imaginary pair)."""
    real = -np.geomspace(0.1, 10.0, dim)
    angles = np.linspace(0.55, 0.95, dim // 2) * np.pi  # arg λ in the left half-plane
    pairs = np.geomspace(0.5, 10.0, dim // 2) * np.exp(1j * angles)
    mixed = np.concatenate([-np.geomspace(0.1, 4.0, dim - 2), [-0.3 + 5j, -0.3 - 5j]])
    return {"real": real, "complex": np.concatenate([pairs, pairs.conj()]), "mixed": mixed}


def _linear_study(config: Config, rng) -> list[StepRow]:
    rows = []
    dim = config.linear_dim
    trial = dict(num_steps=config.linear_steps, growth=config.growth)
    trial["rate_tol"] = config.linear_rate_tol
    s = np.eye(dim) + 0.3 * rng.normal(size=(dim, dim)) / np.sqrt(dim)  # mildly non-normal
    for case, eigs in _linear_cases(dim).items():
        jac = matrix_with_spectrum(eigs, similarity=s)
        for name in config.methods:
            method = wb.registry.UNSPLIT_METHODS[name]
            pred = wa.max_stable_step(method, eigs)
            obs = wa.observed_max_stable_step(method, jac, np.eye(dim), tau_max=3 * pred, **trial)
            rows.append(_row(case, name, pred, obs))
    # Splittings: two non-commuting decaying operators (symmetric negative definite).
    qs = [np.linalg.qr(rng.normal(size=(dim, dim)))[0] for _ in range(2)]
    mats = [-q @ np.diag(a * np.geomspace(0.1, 1.0, dim)) @ q.T for q, a in zip(qs, (1.0, 3.0))]
    rho = max(np.abs(np.linalg.eigvalsh(m)).max() for m in mats)
    for scheme in (wb.registry.METHODS[name] for name in config.splittings):
        pred = wa.max_stable_step_matrix(scheme, mats, tau_max=10 / rho, num_scan=400)
        obs = wa.observed_max_stable_step(scheme, mats, np.eye(dim), tau_max=10 / rho, **trial)
        name = f"{type(scheme).__name__}[{type(scheme.inner).__name__}]"
        rows.append(_row(SPLIT_CASE, name, pred, obs))
    return rows


def _layer(config: Config, eq, layer: int, u) -> Layer:
    fields = wa.term_fields(eq, layer + 0.5)
    # The full field's dense Jacobian and eigendecomposition once, for its spectrum and every
    # method's observed step.
    jac = wa.jacobian_matrix(fields["full"], u)
    lam, vecs = np.linalg.eig(jac)
    eigs = {name: wa.jacobian_spectrum(f, u) for name, f in fields.items() if name != "full"}
    eigs["full"] = full = lam[np.argsort(-np.abs(lam), kind="stable")]
    top = min(4, config.krylov_dim)
    ritz = wa.arnoldi_eigenvalues(
        fields["full"], u, num_eigenvalues=top, krylov_dim=config.krylov_dim
    )
    cutoff = 1e-8 * float(np.abs(full).max())
    decaying = full[full.real < -cutoff]
    steps = {}
    for name in config.methods:
        method = wb.registry.UNSPLIT_METHODS[name]
        pred = wa.max_stable_step(method, decaying)
        obs = wa.observed_modal_max_stable_step(
            method,
            jac,
            tau_max=3 * pred,
            decay_cutoff=cutoff,
            tol=config.amplification_tol,
            eigen=(lam, vecs),
        )
        steps[name] = _row(f"layer {layer}", name, pred, obs)
    return Layer(
        layer=layer,
        spectral_radius={n: float(np.abs(e).max()) for n, e in eigs.items()},
        max_real={n: float(e.real.max()) for n, e in eigs.items()},
        min_real={n: float(e.real.min()) for n, e in eigs.items()},
        num_growing=int((full.real > cutoff).sum()),
        num_decaying=int(decaying.size),
        arnoldi_rel_error=float(np.max(np.abs(ritz - full[:top])) / np.abs(full[0])),
        steps=steps,
        eigenvalues_real={n: np.asarray(e.real) for n, e in eigs.items()},
        eigenvalues_imag={n: np.asarray(e.imag) for n, e in eigs.items()},
    )


def _lipschitz(config: Config, model, rng) -> Lipschitz:
    eq = model.equation
    att = eq.operators[0].term.evaluate(0.5)
    norm = eq.operators[0].projection.evaluate(0.5)

    def estimate(term, n):
        samples = (norm(jnp.asarray(rng.normal(size=(n, model.d)))) for _ in range(n_samples))
        return max(wa.lipschitz_estimate(term.vector_field, x) for x in samples)

    n_samples = config.lipschitz_samples
    vs_beta = [estimate(dataclasses.replace(att, scale=b), config.n) for b in config.betas]
    vs_n = [estimate(att, n) for n in config.seq_lens]
    betas, seq_lens = np.asarray(config.betas), np.asarray(config.seq_lens)
    return Lipschitz(float(att.scale), betas, np.asarray(vs_beta), seq_lens, np.asarray(vs_n))


def _layer_map(local, scheme, u):
    """One layer of the network: one step of the scheme on the equation of that layer."""
    return wb.integrate(local, u, scheme, num_steps=1, throw=False).u1


def compute(config: Config) -> Results:
    with jax.enable_x64(True):
        rng = np.random.default_rng(config.seed)
        linear = _linear_study(config, rng)
        if is_run_folder(config.weights):
            model, u0, _ = trained(config.weights)
            u0 = u0[
                : config.n
            ]  # the first n tokens (the class token first): a state of the equation
            rng.normal(size=(config.n, config.d))  # the random model's draws: the same later ones
        else:
            sd = wb.architectures.random_encoder_state_dict(
                rng, d=config.d, num_layers=config.layers, dim_feedforward=config.dff
            )
            model = wb.architectures.encoder_from_torch(
                sd, num_heads=config.heads, norm_first=True, activation="gelu"
            )
            u0 = jnp.asarray(rng.normal(size=(config.n, config.d)))
        eq = model.equation
        sol = model.solve(u0, save_steps=True)
        k = model.steps_per_layer
        states = [u0] + [sol.us[k * (i + 1) - 1] for i in range(model.num_layers - 1)]
        layers = [
            _layer(config, eq, i, u)
            for i, u in progress(enumerate(states), desc=NAME, total=len(states))
        ]
        lips = _lipschitz(config, model, rng)
        lie = wb.schemes.LieTrotter()
        maps = [
            jax.tree_util.Partial(_layer_map, eq.localize(i), lie) for i in range(eq.num_pieces)
        ]
        ftle, _ = wa.lyapunov_exponents(maps, u0)
    lin_acc = [r.rel_diff for r in linear if r.case != SPLIT_CASE]
    rk = {
        name: wa.stability_function(
            wb.registry.UNSPLIT_METHODS[name] if name in UNSPLIT else wb.registry.METHODS[name]
        ).coefficients
        for name in REGION_RK
    }
    split = {}
    for name in SPLITTINGS:
        scheme = wb.registry.METHODS[name]
        label = f"{name}[{type(scheme.inner).__name__}]"
        split[label] = wa.stability_function(scheme).coefficients
    return Results(
        config=config,
        linear=linear,
        linear_max_abs_rel_diff=float(np.max(np.abs(lin_acc))),
        model=layers,
        lipschitz=lips,
        lyapunov_exponents=np.asarray(ftle),
        rk_regions=rk,
        split_regions=split,
    )


# ---------------------------------------------------------------------------------------------
# Verdict and report


def _worst(rows: list[StepRow]) -> float:
    """The largest |rel. diff|, NaN counting as a failure (inf)."""
    return max((abs(r.rel_diff) if np.isfinite(r.rel_diff) else np.inf for r in rows), default=0.0)


def _step_min(results: Results) -> dict[str, float]:
    return {
        name: min(layer.steps[name].predicted for layer in results.model)
        for name in results.config.methods
    }


def verdict(results: Results) -> str:
    config = results.config
    model_rows = [r for layer in results.model for r in layer.steps.values()]
    lin, mod = _worst(results.linear), _worst(model_rows)
    ok_lin, ok_mod = lin <= config.linear_tolerance, mod <= config.model_tolerance
    word = "Yes" if ok_lin and ok_mod else "Partly" if ok_lin or ok_mod else "No"
    inside = [n for n, t in _step_min(results).items() if t >= 1.0]
    outside = [f"{n} (τ* = {t:.3g})" for n, t in _step_min(results).items() if t < 1.0]
    growing = max(layer.num_growing for layer in results.model)
    lips, ftle = results.lipschitz, results.lyapunov_exponents
    return (
        f"{word}. Predicted and observed τ* agree to {lin:.1e} on {len(results.linear)} linear "
        f"cases (tolerance {config.linear_tolerance:g}"
        + ("" if ok_lin else ", NOT met")
        + f") and to {mod:.1e} on the decaying modes of the encoder's linearization at "
        f"{len(results.model)} layers (tolerance {config.model_tolerance:g}"
        + ("" if ok_mod else ", NOT met")
        + f"). The network's step τ = 1 lies below the smallest predicted τ* for: "
        f"{', '.join(inside) or 'none'}; above it for: {', '.join(outside) or 'none'}; up to "
        f"{growing} modes per layer grow (Re λ > 0; the exact flow grows along them too). Attention's "
        f"Lipschitz estimate is {lips.vs_beta[0]:.3g} at β = {lips.betas[0]:g} and "
        f"{lips.vs_beta[-1]:.3g} at β = {lips.betas[-1]:g}; the layer map's largest Lyapunov "
        f"exponent is {ftle[0]:.3g} ({int((ftle > 1e-12).sum())} of {ftle.size} positive)."
    )


def report(results: Results) -> str:
    config, layers, lips = results.config, results.model, results.lipschitz
    ftle = results.lyapunov_exponents
    rows = [(r.case, r.method, r.predicted, r.observed, r.rel_diff) for r in results.linear]
    lin = markdown_table(
        ["case", "method", "predicted τ*", "observed τ*", "rel. diff"], rows, floatfmt=".5g"
    )
    model_rows = [
        (L.layer, name, r.predicted, r.observed, r.rel_diff, L.num_decaying, L.num_growing)
        + (L.max_real["full"],)
        for L in layers
        for name, r in L.steps.items()
    ]
    headers = "layer|method|predicted τ*|observed τ*|rel. diff|# decaying|# growing|max Re λ"
    mod = markdown_table(headers.split("|"), model_rows, floatfmt=".4g")
    headers = "layer|ρ(J_attn)|ρ(J_ffn)|ρ(J_full)|max Re λ_full|min Re λ_full|Arnoldi rel. err."
    spec = markdown_table(
        headers.split("|"),
        [
            (L.layer, *(L.spectral_radius[k] for k in ("attention", "feed-forward", "full")))
            + (L.max_real["full"], L.min_real["full"], L.arnoldi_rel_error)
            for L in layers
        ],
    )
    lip = markdown_table(["β", "Lipschitz"], list(zip(lips.betas, lips.vs_beta)))
    lipn = markdown_table(["n", "Lipschitz"], list(zip(lips.seq_lens, lips.vs_n)))
    return "\n\n".join(
        [
            "Maximal stable step τ*: the first τ at which some mode is amplified (|R(τλ)| > 1), "
            "predicted from R computed from the Butcher tableau. Observed on the linear fields: "
            f"bisection on ‖U_N‖/‖U_0‖ ≤ {config.growth:g} after N = {config.linear_steps} steps "
            f"of the method's own `step`, with a late growth rate ≤ {config.linear_rate_tol:g} "
            "per step (it resolves τ* where |R(τλ)| leaves 1 slowly, near the imaginary axis). "
            "Observed on the model: one step of the method's own `step` on each decaying "
            "eigenvector, its amplification factor read with the left eigenvector, amplified "
            f"when above 1 + {config.amplification_tol:g}.",
            "### Linear fields with known spectra",
            lin,
            "### Pre-norm encoder: Jacobian spectra along the trajectory",
            spec,
            "τ* below concerns the decaying modes (Re λ < 0) of the frozen-state linearization "
            "per layer (the dense Jacobian).",
            mod,
            "Smallest predicted τ* along the trajectory: "
            + ", ".join(f"{k} {v:.4g}" for k, v in _step_min(results).items())
            + " (the network uses τ = 1).",
            f"### Lipschitz constant of attention (n = {config.n}; model scale "
            f"{lips.default_scale:.3g})",
            lip,
            lipn,
            "### Finite-time Lyapunov exponents of the layer map (per layer)",
            f"largest {ftle[0]:.4g}, smallest {ftle[-1]:.4g}, number > 0: "
            f"{int((ftle > 1e-12).sum())} of {ftle.size}; sum {ftle.sum():.4g}.",
        ]
    )


# ---------------------------------------------------------------------------------------------
# Figures


def figures(results: Results) -> dict:
    return {
        "stability_regions": _plot_regions(results),
        "spectra": _plot_spectra(results),
        "max_stable_step": _plot_steps(results),
        "lipschitz": _plot_lipschitz(results.lipschitz),
        "lyapunov": _plot_ftle(results.lyapunov_exponents),
    }


def _plot_regions(results: Results):
    fig, axes = new_figure(1, 2, figsize=(12, 5))
    x, y = np.meshgrid(np.linspace(-6, 2, 400), np.linspace(-4, 4, 400))
    z = x + 1j * y
    full = [(L.eigenvalues_real["full"], L.eigenvalues_imag["full"]) for L in results.model]
    titles = (
        "explicit RK: |R(z)| = 1",
        "splittings, commuting operators λ_k = z/2: |Π R_inner(a z/2)| = 1",
    )
    for ax, regions, title in zip(axes, (results.rk_regions, results.split_regions), titles):
        for (name, coeffs), color in zip(regions.items(), ["C0", "C1", "C2", "C3", "C4"]):
            ax.contour(
                x, y, np.abs(np.polynomial.polynomial.polyval(z, coeffs)), [1.0], colors=color
            )
            ax.plot([], [], color=color, label=name)
        ax.scatter(
            np.concatenate([r for r, _ in full]),
            np.concatenate([i for _, i in full]),
            s=8,
            c="k",
            marker="x",
            label="τλ(J_full), τ = 1",
        )
        ax.axhline(0, color="0.7", lw=0.5)
        ax.axvline(0, color="0.7", lw=0.5)
        ax.set(xlabel="Re z", ylabel="Im z", aspect="equal")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    return fig


def _plot_spectra(results: Results):
    fig, axes = new_figure(1, 3, figsize=(14, 4.2))
    for ax, name in zip(axes, ("attention", "feed-forward", "full")):
        for L in results.model:
            ax.scatter(
                L.eigenvalues_real[name], L.eigenvalues_imag[name], s=10, label=f"layer {L.layer}"
            )
        ax.axvline(0, color="0.6", lw=0.5)
        ax.set(xlabel="Re λ", ylabel="Im λ", title=f"Jacobian eigenvalues: {name}")
        ax.legend(fontsize=7)
    return fig


def _plot_steps(results: Results):
    fig, ax = new_figure(figsize=(6, 5))
    pts = [(r.predicted, r.observed, r.case) for r in results.linear]
    pts += [(r.predicted, r.observed, "model") for L in results.model for r in L.steps.values()]
    for case in dict.fromkeys(p[2] for p in pts):
        sel = [(p, o) for p, o, c in pts if c == case and np.isfinite(p) and np.isfinite(o)]
        if sel:
            a = np.asarray(sel)
            ax.scatter(a[:, 0], a[:, 1], label=case, s=20)
    finite = [v for p in pts for v in p[:2] if np.isfinite(v) and v > 0]
    lo, hi = min(finite) / 1.5, max(finite) * 1.5
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="observed = predicted")
    ax.set(xscale="log", yscale="log", title="Max stable step: predicted vs observed")
    ax.set(xlabel="predicted max stable step τ*", ylabel="observed max stable step τ*")
    ax.legend(fontsize=8)
    return fig


def _plot_lipschitz(lips: Lipschitz):
    fig, axes = new_figure(1, 2, figsize=(11, 4.2))
    ylabel = "max local Lipschitz constant ‖∂A/∂u‖₂"
    axes[0].loglog(lips.betas, lips.vs_beta, "o-")
    axes[0].axvline(lips.default_scale, color="0.6", ls=":", label="model's scale")
    axes[0].set(xlabel="attention scale β", ylabel=ylabel, title="Attention Lipschitz vs β")
    axes[0].legend()
    axes[1].semilogx(lips.seq_lens, lips.vs_n, "o-", base=2)
    title = "Attention Lipschitz vs n (model's scale)"
    axes[1].set(xlabel="sequence length n", ylabel=ylabel, title=title)
    return fig


def _plot_ftle(ftle: np.ndarray):
    fig, ax = new_figure(figsize=(6, 4))
    ax.plot(np.arange(1, ftle.size + 1), ftle, ".-")
    ax.axhline(0, color="0.6", lw=0.5)
    ax.set(xlabel="index i", ylabel="λ_i (per layer)")
    ax.set_title("Finite-time Lyapunov exponents of the layer map")
    return fig
