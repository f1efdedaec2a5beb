"""Which steps are stable for each scheme, on a linear field with a known spectrum and on a
pre-norm Transformer; how Lipschitz is attention in β and n; how the layer map stretches.

1. **Linear fields with known spectra** (`J = S Λ S⁻¹`, real negative and complex spectra, and
   two non-commuting decaying operators for the splittings): the predicted maximal stable step
   (first exit of `τλ` from the stability region of `R`, computed from each method's Butcher
   data) against the observed one (bisection on the growth `‖U_N‖/‖U_0‖` of the actual
   integration by the method's own `step`).
2. **A random pre-norm encoder** (GELU): dense Jacobian spectra of the attention operator, the
   feed-forward operator and the full field at each layer along the trajectory (checked against
   matrix-free Arnoldi); the stability regions of every scheme with `τλ` (τ = 1, the network's
   step) over them. The pre-norm field has growing modes (`Re λ > 0`) that no explicit step
   damps, so the prediction uses the decaying modes (`Re λ < 0`) and the observation integrates
   the linearized (frozen-state) field `v' = J(u_l) v` (dense Jacobian of the model, checked
   against JVP-based Arnoldi) with the spectral projector onto those modes applied after every
   step (the exact step map leaves that subspace invariant: it only removes round-off).
3. The local Lipschitz constant of attention (power iteration on `JᵀJ`) on layer-normed random
   inputs, max over samples, against the attention scale β and the sequence length n.
4. Finite-time Lyapunov exponents of the network's layer map (QR method) along the trajectory.
"""

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

import workbench as wb
from workbench import analysis as wa

NAME = "stability"
SUMMARY = "Stability regions vs Jacobian spectra, max stable steps, Lipschitz of attention, FTLEs."

RK_METHODS = {"euler": wb.schemes.Euler, "heun": wb.schemes.Heun, "rk4": wb.schemes.RK4}
SPLITTINGS = {
    "lie": wb.schemes.LieTrotter,
    "strang": wb.schemes.Strang,
    "yoshida4": wb.schemes.Yoshida4,
    "suzuki4": wb.schemes.Suzuki4,
}


@dataclasses.dataclass(frozen=True)
class Config:
    methods: tuple[str, ...] = ("euler", "heun", "rk4")
    splittings: tuple[str, ...] = ("lie", "strang", "yoshida4", "suzuki4")
    """Splitting schemes checked on two non-commuting linear operators."""
    linear_dim: int = 12
    """Size of the linear test fields."""
    linear_steps: int = 4000
    """Steps per growth trial of the observed step (linear fields)."""
    growth: float = 1e3
    """Stable = ‖U_N‖/‖U_0‖ ≤ growth and a late growth rate ≤ the rate tolerance below."""
    linear_rate_tol: float = 1e-6
    """Largest accepted late growth rate per step (linear fields)."""
    model_rate_tol: float = 1e-4
    """The same on the model's linearization (looser: the spectral projector of a non-normal
    Jacobian is applied in floating point and leaks a little)."""
    d: int = 16
    heads: int = 4
    layers: int = 4
    dff: int = 32
    n: int = 8
    model_steps: int = 2000
    """Steps per growth trial on the model's linearization."""
    krylov_dim: int = 64
    betas: tuple[float, ...] = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
    seq_lens: tuple[int, ...] = (2, 4, 8, 16, 32, 64)
    lipschitz_samples: int = 8
    seed: int = 0


def smoke_config() -> Config:
    return Config(
        linear_dim=8,
        linear_steps=2000,
        d=8,
        heads=2,
        layers=2,
        dff=16,
        n=4,
        model_steps=1000,
        krylov_dim=24,
        splittings=("lie",),
        betas=(0.25, 4.0),
        seq_lens=(4, 16),
        lipschitz_samples=1,
    )


def _check(config: Config) -> None:
    for name in config.methods:
        if name not in RK_METHODS:
            raise ValueError(f"methods: {name!r} is not known; valid: {', '.join(RK_METHODS)}.")
    for name in config.splittings:
        if name not in SPLITTINGS:
            raise ValueError(f"splittings: {name!r} is not known; valid: {', '.join(SPLITTINGS)}.")
    for field in ("linear_dim", "linear_steps", "d", "heads", "layers", "dff", "n"):
        value = getattr(config, field)
        if value < 1:
            raise ValueError(f"{field}={value} must be a positive integer.")
    if config.linear_dim < 4:
        raise ValueError(f"linear_dim={config.linear_dim} must be >= 4 (it holds a complex pair).")
    if not config.growth > 1:
        raise ValueError(f"growth={config.growth} must be > 1.")
    if any(b <= 0 for b in config.betas) or any(n < 1 for n in config.seq_lens):
        raise ValueError("betas must be positive and seq_lens positive integers.")
    if not jax.config.jax_enable_x64:
        raise ValueError("the stability study runs in float64; run via `workbench run`.")


# ---------------------------------------------------------------------------------------------
# 1. linear fields


def _linear_cases(dim: int, rng) -> dict[str, np.ndarray]:
    """Eigenvalue sets: real negative; complex pairs; mixed (real + near-imaginary pair)."""
    real = -np.geomspace(0.1, 10.0, dim)
    angles = np.linspace(0.55, 0.95, dim // 2) * np.pi  # arg λ in the left half-plane
    radii = np.geomspace(0.5, 10.0, dim // 2)
    pairs = radii * np.exp(1j * angles)
    complex_ = np.concatenate([pairs, pairs.conj()])
    mixed = np.concatenate([-np.geomspace(0.1, 4.0, dim - 2), [-0.3 + 5j, -0.3 - 5j]])
    return {"real": real, "complex": complex_, "mixed": mixed}


def _real_block(eigs: np.ndarray) -> np.ndarray:
    """A real block-diagonal matrix with eigenvalues `eigs` (pairs as 2×2 rotations)."""
    blocks, done = [], set()
    for i, lam in enumerate(eigs):
        if i in done:
            continue
        if abs(lam.imag) < 1e-14:
            blocks.append(np.array([[lam.real]]))
        else:
            j = next(
                k
                for k in range(len(eigs))
                if k not in done and k != i and np.isclose(eigs[k], lam.conj())
            )
            done.add(j)
            blocks.append(np.array([[lam.real, lam.imag], [-lam.imag, lam.real]]))
        done.add(i)
    return scipy.linalg.block_diag(*blocks)


def _linear_study(config: Config, rng) -> list[dict]:
    rows = []
    dim = config.linear_dim
    s = np.eye(dim) + 0.3 * rng.normal(size=(dim, dim)) / np.sqrt(dim)  # mildly non-normal
    s_inv = np.linalg.inv(s)
    for case, eigs in _linear_cases(dim, rng).items():
        jac = s @ _real_block(eigs) @ s_inv
        for name in config.methods:
            method = RK_METHODS[name]()
            pred = wa.max_stable_step(method, eigs)
            obs = wa.observed_max_stable_step(
                method,
                jac,
                np.eye(dim),
                tau_max=3 * pred,
                num_steps=config.linear_steps,
                growth=config.growth,
                rate_tol=config.linear_rate_tol,
            )
            rows.append(_row(case, name, pred, obs))
    # Splittings: two non-commuting decaying operators (symmetric negative definite).
    a1, a2 = (_spd(dim, rng, scale) for scale in (1.0, 3.0))
    mats = [-a1, -a2]
    rho = max(np.abs(np.linalg.eigvalsh(m)).max() for m in mats)
    for scheme in (SPLITTINGS[name]() for name in config.splittings):
        pred = wa.max_stable_step_matrix(scheme, mats, tau_max=10 / rho, num_scan=400)
        obs = wa.observed_max_stable_step(
            scheme,
            mats,
            np.eye(dim),
            tau_max=10 / rho,
            num_steps=config.linear_steps,
            growth=config.growth,
            rate_tol=config.linear_rate_tol,
        )
        name = f"{type(scheme).__name__}[{type(scheme.inner).__name__}]"
        rows.append(_row("split (non-commuting)", name, pred, obs))
    return rows


def _spd(dim, rng, scale):
    q, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    return q @ np.diag(scale * np.geomspace(0.1, 1.0, dim)) @ q.T


def _row(case, method, pred, obs):
    rel = (obs - pred) / pred if np.isfinite(pred) and pred > 0 else None
    return {"case": case, "method": method, "predicted": pred, "observed": obs, "rel_diff": rel}


# ---------------------------------------------------------------------------------------------
# 2. the pre-norm model


def _model(config: Config, rng):
    sd = wb.architectures.random_encoder_state_dict(
        rng, d=config.d, num_layers=config.layers, dim_feedforward=config.dff
    )
    return wb.architectures.encoder_from_torch(
        sd, num_heads=config.heads, norm_first=True, activation="gelu"
    )


def _spectral_projector(jac: np.ndarray, cutoff: float):
    """Projector onto the modes with `Re λ < −cutoff` along the others, from a sorted Schur form."""
    t, z, k = scipy.linalg.schur(jac, output="complex", sort=lambda x: x.real < -cutoff)
    if k == 0:
        return None, 0
    # Block-diagonalize T = [[T11, T12], [0, T22]]: solve T11 X − X T22 = −T12.
    x = scipy.linalg.solve_sylvester(t[:k, :k], -t[k:, k:], -t[:k, k:])
    left = np.hstack([np.eye(k), x])  # rows of the block-diagonalizing inverse
    p = z[:, :k] @ left @ z.conj().T
    return np.real(p), k


def _model_study(config: Config, model, u0):
    eq = model.equation
    sol = model.solve(u0, save_steps=True)
    states = [u0] + [sol.us[i] for i in range(config.layers - 1)]
    layers, spectra = [], {"attention": [], "feed-forward": [], "full": []}
    for layer, u in enumerate(states):
        t = layer + 0.5
        fields = wa.term_fields(eq, t)
        eigs = {name: wa.jacobian_spectrum(f, u) for name, f in fields.items()}
        for name in spectra:
            spectra[name].append(eigs[name])
        full = eigs["full"]
        top = min(4, config.krylov_dim)
        ritz = wa.arnoldi_eigenvalues(
            fields["full"], u, num_eigenvalues=top, krylov_dim=config.krylov_dim
        )
        arnoldi_err = float(np.max(np.abs(ritz - full[:top])) / np.abs(full[0]))
        rho = float(np.abs(full).max())
        cutoff = 1e-8 * rho
        decaying = full[full.real < -cutoff]
        jac = wa.jacobian_matrix(fields["full"], u)
        proj, k = _spectral_projector(jac, cutoff)
        frame = proj @ np.random.default_rng(layer).normal(size=(u.size, k))
        row = {
            "layer": layer,
            "spectral_radius": {n: float(np.abs(e).max()) for n, e in eigs.items()},
            "max_real": {n: float(e.real.max()) for n, e in eigs.items()},
            "min_real": {n: float(e.real.min()) for n, e in eigs.items()},
            "num_growing": int((full.real > cutoff).sum()),
            "num_decaying": int(decaying.size),
            "arnoldi_rel_error": arnoldi_err,
            "steps": {},
        }
        for name in config.methods:
            method = RK_METHODS[name]()
            pred = wa.max_stable_step(method, decaying)
            obs = wa.observed_max_stable_step(
                method,
                jac,
                frame,
                tau_max=3 * pred,
                num_steps=config.model_steps,
                growth=config.growth,
                projector=proj,
                rate_tol=config.model_rate_tol,
            )
            row["steps"][name] = _row(f"layer {layer}", name, pred, obs)
        layers.append(row)
    return layers, spectra, sol


def _lipschitz(config: Config, model, rng):
    eq = model.equation
    att = eq.operators[0].term.evaluate(0.5)
    norm = eq.operators[0].projection.evaluate(0.5)
    default_scale = float(att.scale)

    def with_scale(beta):
        return wb.terms.MultiHeadAttention(
            att.query,
            att.key,
            att.value,
            att.output,
            att.query_bias,
            att.key_bias,
            att.value_bias,
            att.output_bias,
            num_heads=att.num_heads,
            scale=beta,
            causal=att.causal,
        )

    def estimate(term, n):
        best = 0.0
        for _ in range(config.lipschitz_samples):
            x = norm(jnp.asarray(rng.normal(size=(n, config.d))))
            best = max(best, wa.lipschitz_estimate(term.vector_field, x))
        return best

    vs_beta = [estimate(with_scale(b), config.n) for b in config.betas]
    vs_n = [estimate(att, n) for n in config.seq_lens]
    return {
        "default_scale": default_scale,
        "betas": list(config.betas),
        "vs_beta": vs_beta,
        "seq_lens": list(config.seq_lens),
        "vs_n": vs_n,
    }


def _lyapunov(model, u0):
    eq = model.equation
    scheme = wb.schemes.LieTrotter()

    maps = [
        jax.tree_util.Partial(_layer_map, eq.localize(layer), scheme)
        for layer in range(eq.num_pieces)
    ]
    exps, _ = wa.lyapunov_exponents(maps, u0)
    return exps


def _layer_map(local, scheme, u):
    """One layer of the network: one step of the scheme on the equation of that layer."""
    return wb.integrate(local, u, scheme, num_steps=1, throw=False).u1


# ---------------------------------------------------------------------------------------------


def main(config: Config, out: pathlib.Path) -> dict:
    _check(config)
    rng = np.random.default_rng(config.seed)
    linear = _linear_study(config, rng)
    model = _model(config, rng)
    u0 = jnp.asarray(rng.normal(size=(config.n, config.d)))
    layers, spectra, _ = _model_study(config, model, u0)
    lips = _lipschitz(config, model, rng)
    ftle = _lyapunov(model, u0)
    if wb.report.have_matplotlib():
        _plot_regions(config, spectra, out / "stability_regions.png")
        _plot_spectra(layers, spectra, out / "spectra.png")
        _plot_steps(linear, layers, out / "max_stable_step.png")
        _plot_lipschitz(lips, out / "lipschitz.png")
        _plot_ftle(ftle, out / "lyapunov.png")
    lin_acc = [
        r["rel_diff"]
        for r in linear
        if r["method"] in config.methods and r["case"] != "split (non-commuting)"
    ]
    return {
        "linear": linear,
        "linear_max_abs_rel_diff": float(np.max(np.abs(lin_acc))),
        "model": layers,
        "lipschitz": lips,
        "lyapunov_exponents": ftle.tolist(),
        "report": _report(config, linear, layers, lips, ftle),
    }


def _report(config, linear, layers, lips, ftle) -> str:
    lin = wb.report.markdown_table(
        ["case", "method", "predicted τ*", "observed τ*", "rel. diff"],
        [(r["case"], r["method"], r["predicted"], r["observed"], r["rel_diff"]) for r in linear],
        floatfmt=".5g",
    )
    model_rows = []
    for row in layers:
        for name, r in row["steps"].items():
            model_rows.append(
                (
                    row["layer"],
                    name,
                    r["predicted"],
                    r["observed"],
                    r["rel_diff"],
                    row["num_decaying"],
                    row["num_growing"],
                    row["max_real"]["full"],
                )
            )
    mod = wb.report.markdown_table(
        [
            "layer",
            "method",
            "predicted τ*",
            "observed τ*",
            "rel. diff",
            "# decaying",
            "# growing",
            "max Re λ",
        ],
        model_rows,
        floatfmt=".4g",
    )
    spec = wb.report.markdown_table(
        [
            "layer",
            "ρ(J_attn)",
            "ρ(J_ffn)",
            "ρ(J_full)",
            "max Re λ_full",
            "min Re λ_full",
            "Arnoldi rel. err.",
        ],
        [
            (
                r["layer"],
                r["spectral_radius"]["attention"],
                r["spectral_radius"]["feed-forward"],
                r["spectral_radius"]["full"],
                r["max_real"]["full"],
                r["min_real"]["full"],
                r["arnoldi_rel_error"],
            )
            for r in layers
        ],
    )
    lip = wb.report.markdown_table(["β", "Lipschitz"], list(zip(lips["betas"], lips["vs_beta"])))
    lipn = wb.report.markdown_table(["n", "Lipschitz"], list(zip(lips["seq_lens"], lips["vs_n"])))
    step_min = {
        name: min(row["steps"][name]["predicted"] for row in layers) for name in config.methods
    }
    return "\n\n".join(
        [
            "Maximal stable step τ*: the first τ at which some mode is amplified (|R(τλ)| > 1), "
            "predicted from R computed from the Butcher tableau; observed = bisection on "
            f"‖U_N‖/‖U_0‖ ≤ {config.growth:g} after N = {config.linear_steps} (linear) / "
            f"{config.model_steps} (model) steps of the method's own `step`.",
            "### Linear fields with known spectra",
            lin,
            "Where the limiting eigenvalue is near the imaginary axis (the `mixed` case's "
            "−0.3 ± 5i for Euler) |R(τλ)| leaves 1 slowly: the growth bound alone would resolve "
            "τ* only to about log(growth)/(N·d log|R|/dτ) (tens of per cent); the late growth "
            "rate criterion (rate ≤ rate_tol per step over the second half) resolves it.",
            "### Pre-norm encoder: Jacobian spectra along the trajectory",
            spec,
            "The full field has growing modes (Re λ > 0, partly from the feed-forward block); "
            "no step size damps them and the exact flow grows too, so τ* below concerns the "
            "decaying modes only (frozen state per layer, linearized field integrated with the dense Jacobian).",
            mod,
            "Smallest predicted τ* along the trajectory: "
            + ", ".join(f"{k} {v:.4g}" for k, v in step_min.items())
            + " (the network uses τ = 1).",
            f"### Lipschitz constant of attention (n = {config.n}; model scale "
            f"{lips['default_scale']:.3g})",
            lip,
            lipn,
            "### Finite-time Lyapunov exponents of the layer map (per layer)",
            f"largest {ftle[0]:.4g}, smallest {ftle[-1]:.4g}, number > 0: {int((ftle > 1e-12).sum())} "
            f"of {ftle.size}; sum {ftle.sum():.4g}.",
        ]
    )


# ---------------------------------------------------------------------------------------------
# plots


def _region_methods():
    import diffrax

    rk = [
        wb.schemes.Euler(),
        wb.schemes.Heun(),
        wb.schemes.RK4(),
        diffrax.Tsit5(),
        diffrax.Dopri5(),
    ]
    split = [
        wb.schemes.LieTrotter(),
        wb.schemes.Strang(),
        wb.schemes.Yoshida4(),
        wb.schemes.Suzuki4(),
    ]
    return rk, split


def _plot_regions(config, spectra, path):
    fig, axes = wb.report.new_figure(1, 2, figsize=(12, 5))
    x, y = np.meshgrid(np.linspace(-6, 2, 400), np.linspace(-4, 4, 400))
    z = x + 1j * y
    rk, split = _region_methods()
    full = np.concatenate(spectra["full"])
    colors = ["C0", "C1", "C2", "C3", "C4"]
    titles = (
        "explicit RK: |R(z)| = 1",
        "splittings, commuting operators λ_k = z/2: |Π R_inner(a z/2)| = 1",
    )
    for ax, methods, title in zip(axes, (rk, split), titles):
        for m, color in zip(methods, colors):
            r = wa.stability_function(m)
            ax.contour(x, y, np.abs(r(z)), levels=[1.0], colors=color)
            ax.plot([], [], color=color, label=r.name)
        ax.scatter(full.real, full.imag, s=8, c="k", marker="x", label="τλ(J_full), τ = 1")
        ax.axhline(0, color="0.7", lw=0.5)
        ax.axvline(0, color="0.7", lw=0.5)
        ax.set_xlabel("Re z")
        ax.set_ylabel("Im z")
        ax.set_title(title, fontsize=9)
        ax.set_aspect("equal")
        ax.legend(fontsize=7, loc="upper left")
    save_path = wb.report.save_figure(fig, path)
    return save_path


def _plot_spectra(layers, spectra, path):
    fig, axes = wb.report.new_figure(1, 3, figsize=(14, 4.2))
    for ax, name in zip(axes, ("attention", "feed-forward", "full")):
        for layer, eigs in enumerate(spectra[name]):
            ax.scatter(eigs.real, eigs.imag, s=10, label=f"layer {layer}")
        ax.axvline(0, color="0.6", lw=0.5)
        ax.set_xlabel("Re λ")
        ax.set_ylabel("Im λ")
        ax.set_title(f"Jacobian eigenvalues: {name}")
        ax.legend(fontsize=7)
    wb.report.save_figure(fig, path)


def _plot_steps(linear, layers, path):
    fig, ax = wb.report.new_figure(figsize=(6, 5))
    pts = [(r["predicted"], r["observed"], r["case"]) for r in linear]
    pts += [
        (r["predicted"], r["observed"], "model") for row in layers for r in row["steps"].values()
    ]
    for case in dict.fromkeys(p[2] for p in pts):
        sel = [(p, o) for p, o, c in pts if c == case and np.isfinite(p) and np.isfinite(o)]
        if sel:
            a = np.asarray(sel)
            ax.scatter(a[:, 0], a[:, 1], label=case, s=20)
    finite = [v for p in pts for v in p[:2] if np.isfinite(v) and v > 0]
    lo, hi = min(finite) / 1.5, max(finite) * 1.5
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="observed = predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted max stable step τ*")
    ax.set_ylabel("observed max stable step τ*")
    ax.set_title("Max stable step: predicted vs observed")
    ax.legend(fontsize=8)
    wb.report.save_figure(fig, path)


def _plot_lipschitz(lips, path):
    fig, axes = wb.report.new_figure(1, 2, figsize=(11, 4.2))
    axes[0].loglog(lips["betas"], lips["vs_beta"], "o-")
    axes[0].axvline(lips["default_scale"], color="0.6", ls=":", label="model's scale")
    axes[0].set_xlabel("attention scale β")
    axes[0].set_ylabel("max local Lipschitz constant ‖∂A/∂u‖₂")
    axes[0].set_title("Attention Lipschitz vs β")
    axes[0].legend()
    axes[1].semilogx(lips["seq_lens"], lips["vs_n"], "o-", base=2)
    axes[1].set_xlabel("sequence length n")
    axes[1].set_ylabel("max local Lipschitz constant ‖∂A/∂u‖₂")
    axes[1].set_title("Attention Lipschitz vs n (model's scale)")
    wb.report.save_figure(fig, path)


def _plot_ftle(ftle, path):
    fig, ax = wb.report.new_figure(figsize=(6, 4))
    ax.plot(np.arange(1, ftle.size + 1), ftle, ".-")
    ax.axhline(0, color="0.6", lw=0.5)
    ax.set_xlabel("index i")
    ax.set_ylabel("λ_i (per layer)")
    ax.set_title("Finite-time Lyapunov exponents of the layer map")
    wb.report.save_figure(fig, path)
