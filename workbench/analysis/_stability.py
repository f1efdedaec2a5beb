r"""Linear stability of the schemes, computed from their own data.

For the linear test equation `u' = λu` one step of an explicit Runge–Kutta method with tableau
`(A, b)` multiplies `u` by its stability function

$$R(z) = 1 + z\, b^\top (I - zA)^{-1} \mathbf 1 = \sum_{k=0}^{s} \gamma_k z^k,\qquad
  \gamma_0 = 1,\ \gamma_k = b^\top A^{k-1} \mathbf 1,\qquad z = \tau\lambda,$$

a polynomial because `A` is strictly lower triangular (nilpotent). For `u' = Ju` the step map is
`R(τJ)`. A splitting scheme applies, stage by stage, the inner method to one operator over a
fraction `a` of the step, so its linearized step map is

$$M(\tau) = R_{\text{inner}}(a_S \tau J_{k_S}) \cdots R_{\text{inner}}(a_1 \tau J_{k_1}).$$

When the operators commute and have eigenvalues `λ_k = α_k z` on a shared eigenvector this is the
scalar polynomial `Π_stages R_inner(a α_k z)`: the region plotted for a splitting.

The *maximal stable step* for a spectrum is the first instability: the largest `τ*` such that
`|R(sλ)| ≤ 1` for every eigenvalue and every `0 < s ≤ τ*`. Regions need not be star-shaped, so
a step beyond `τ*` can be stable again; `τ*` is the bound a step-size sweep meets first.
Reference: Hairer & Wanner, *Solving ODEs II*, §IV.2.
"""

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from numpy.polynomial import polynomial as P

from .._checks import number_in_range, positive_float, positive_int
from ..schemes._runge_kutta import AbstractExplicitRK, ButcherTableau
from ..schemes._splitting import AbstractSplittingScheme


@dataclasses.dataclass(frozen=True)
class StabilityFunction:
    r"""A polynomial stability function `R(z) = Σ_k coefficients[k] z^k`.

    **Fields:**

    - `coefficients`: real coefficients in increasing powers of `z` (`coefficients[0] = 1`).
    - `name`: the method it came from, for plots and reports.

    Call it on any complex array: `R(z)` is evaluated elementwise (NumPy).
    """

    coefficients: np.ndarray
    name: str

    def __call__(self, z):
        return P.polyval(np.asarray(z, dtype=complex), self.coefficients)

    @property
    def degree(self) -> int:
        return len(self.coefficients) - 1

    def of_matrix(self, matrix: np.ndarray) -> np.ndarray:
        """`R(Z)` for a square matrix `Z` (Horner's rule)."""
        z = np.asarray(matrix)
        out = np.zeros_like(z, dtype=np.result_type(z.dtype, float))
        eye = np.eye(z.shape[0])
        for c in self.coefficients[::-1]:
            out = out @ z + c * eye
        return out


def _tableau_arrays(method) -> tuple[np.ndarray, np.ndarray, str]:
    """`(A, b, name)` of an explicit RK method: ours, a `ButcherTableau`, or a diffrax solver."""
    if isinstance(method, ButcherTableau):
        return method.a_matrix, np.asarray(method.b, float), "tableau"
    if isinstance(method, AbstractExplicitRK):
        return method.tableau.a_matrix, np.asarray(method.tableau.b, float), type(method).__name__
    tab = getattr(type(method), "tableau", None)
    try:
        import diffrax

        is_diffrax = isinstance(method, diffrax.AbstractRungeKutta)
    except ImportError:  # pragma: no cover - diffrax is a dependency
        is_diffrax = False
    if is_diffrax and tab is not None and not callable(tab):
        tab = method.tableau
        name = type(method).__name__
        if tab.implicit or (tab.a_diagonal is not None and np.any(np.asarray(tab.a_diagonal))):
            raise ValueError(
                f"method={name}: implicit Runge–Kutta tableau; its R(z) is rational, and only "
                "explicit methods (polynomial R) are supported, e.g. diffrax.Tsit5() or "
                "workbench.schemes.RK4()."
            )
        b = np.asarray(tab.b_sol, float)
        s = len(b)
        a = np.zeros((s, s))
        for i, row in enumerate(tab.a_lower):
            a[i + 1, : len(row)] = np.asarray(row, float)
        return a, b, name
    raise ValueError(
        f"method={method!r} has no explicit Butcher tableau; pass an explicit Runge–Kutta method "
        "(workbench.schemes.Euler(), Heun(), Midpoint(), RK4(), a ButcherTableau, or a diffrax "
        "explicit solver such as diffrax.Tsit5()), or a splitting scheme "
        "(workbench.schemes.LieTrotter(), Strang(), Yoshida4(), Suzuki4())."
    )


def _check_weights(weights) -> np.ndarray:
    w = np.asarray(weights, float)
    if w.ndim != 1 or w.size < 1 or not np.all(np.isfinite(w)):
        raise ValueError(
            f"weights={weights!r} must be a non-empty 1-D sequence of finite numbers α_k "
            "(operator k has eigenvalue α_k z), e.g. (0.5, 0.5)."
        )
    return w


def stability_function(method, *, weights: Sequence[float] = (0.5, 0.5)) -> StabilityFunction:
    r"""The stability function of a method, from its Butcher data.

    - Explicit RK (`workbench.schemes` methods, a `ButcherTableau`, diffrax explicit solvers):
      `R(z) = 1 + z bᵀ(I − zA)⁻¹1 = Σ_k (bᵀA^{k−1}1) z^k`.
    - Splitting scheme: the commuting case, operator `k` having eigenvalue `α_k z`:
      `R(z) = Π_{(k, a) ∈ stages} R_inner(a α_k z)`.

    **Arguments:**

    - `method`: the method.
    - `weights`: for splittings only, the `α_k` (one per operator, the number of operators is
      their count); `(½, ½)` = two commuting operators sharing the field's eigenvalue equally.

    **Returns:** a `StabilityFunction` (callable on complex arrays).

    ```python
    R = stability_function(workbench.schemes.RK4())
    R.coefficients  # [1, 1, 1/2, 1/6, 1/24]
    ```
    """
    if isinstance(method, AbstractSplittingScheme):
        w = _check_weights(weights)
        inner = stability_function(method.inner).coefficients
        powers = np.arange(len(inner))
        coeffs = np.array([1.0])
        for k, a in method.stages(len(w)):
            coeffs = P.polymul(coeffs, inner * (a * w[k]) ** powers)
        name = f"{type(method).__name__}[{type(method.inner).__name__}]"
        return StabilityFunction(np.trim_zeros(coeffs, "b"), name)
    a, b, name = _tableau_arrays(method)
    coeffs = [1.0]
    v = np.ones(len(b))
    for _ in range(len(b)):
        coeffs.append(float(b @ v))
        v = a @ v
    return StabilityFunction(np.trim_zeros(np.asarray(coeffs), "b"), name)


def _as_stability_function(method) -> StabilityFunction:
    return method if isinstance(method, StabilityFunction) else stability_function(method)


def _first_unstable_radius(coeffs: np.ndarray, direction: complex, tol: float) -> float:
    """The first `s > 0` where `|R(s e^{iθ})| > 1`, exactly, from the roots of `|R|² − 1`."""
    r = coeffs * direction ** np.arange(len(coeffs))  # R(s e^{iθ}) = Σ r_j s^j
    p = np.real(np.convolve(r, np.conj(r)))  # |R|² as a real polynomial in s
    p[0] -= 1.0
    q = np.trim_zeros(p[1:], "b")  # p(s) = s q(s), p(0) = 0
    if q.size == 0:
        return np.inf
    roots = P.polyroots(q) if q.size > 1 else np.array([])
    real = np.sort([x.real for x in roots if x.real > 0 and abs(x.imag) <= 1e-7 * max(1.0, abs(x))])
    cuts = np.concatenate([[0.0], real])
    tests = np.concatenate([0.5 * (cuts[:-1] + cuts[1:]), [2 * cuts[-1] + 1.0]])
    for left, s in zip(cuts, tests):
        if P.polyval(s, p) > tol * max(1.0, abs(P.polyval(s, np.abs(p)))):
            return float(left)
    return np.inf


def max_stable_step(method, eigenvalues, *, tol: float = 1e-12) -> float:
    r"""The predicted maximal stable step for a spectrum: the first `τ` where `|R(τλ)| > 1`.

    For each eigenvalue `λ = ρe^{iθ} ≠ 0`, `|R(se^{iθ})|² − 1` is a real polynomial in `s`
    (degree `2s_stages`); its positive real roots, checked by the sign between them, give the
    first exit from the stability region exactly (no scan). Zero eigenvalues are neutral and
    skipped. An eigenvalue with `Re λ > 0` (a growing mode of the exact flow) gives `0`.

    **Arguments:**

    - `method`: an explicit RK method, a splitting scheme (commuting case with equal weights, see
      `stability_function`), or a `StabilityFunction`.
    - `eigenvalues`: complex array of eigenvalues `λ` of the Jacobian.
    - `tol`: relative tolerance on `|R|² − 1` (positive).

    **Returns:** `τ*` (a float; `inf` if every `τ > 0` is stable, e.g. an empty spectrum).

    Explicit Euler on `λ = −L`: `2/L`; RK4: `≈ 2.7853/L`.
    """
    positive_float("tol", tol, finite=False, hint="e.g. 1e-12")
    lam = np.atleast_1d(np.asarray(eigenvalues, dtype=complex)).ravel()
    if not np.all(np.isfinite(lam)):
        raise ValueError("eigenvalues contain NaN or inf; compute the spectrum of a finite state.")
    coeffs = _as_stability_function(method).coefficients
    best = np.inf
    for x in lam:
        rho = abs(x)
        if rho == 0:
            continue
        best = min(best, _first_unstable_radius(coeffs, x / rho, tol) / rho)
    return float(best)


def step_matrix(method, jacobians, tau: float) -> np.ndarray:
    r"""The one-step map of a linear problem: `R(τJ)` (RK) or `M(τ) = Π R_inner(aτJ_k)` (splitting).

    **Arguments:**

    - `method`: an explicit RK method, a splitting scheme, or a `StabilityFunction`.
    - `jacobians`: one square matrix `J` (RK), or a sequence of operator Jacobians `J_k` (a
      splitting: one per operator; for an RK method they are summed).
    - `tau`: the step.

    **Returns:** the matrix `M` with `u_{n+1} = M u_n`.
    """
    mats = _as_matrices(jacobians)
    if isinstance(method, AbstractSplittingScheme):
        inner = stability_function(method.inner)
        out = np.eye(mats[0].shape[0])
        for k, a in method.stages(len(mats)):
            out = inner.of_matrix(a * tau * mats[k]) @ out
        return out
    return _as_stability_function(method).of_matrix(tau * sum(mats))


def _as_matrices(jacobians) -> list[np.ndarray]:
    arr = jacobians
    mats = [np.asarray(arr)] if np.ndim(arr) == 2 else [np.asarray(j) for j in arr]
    if not mats or any(m.ndim != 2 or m.shape[0] != m.shape[1] for m in mats):
        raise ValueError(
            "jacobians must be one square matrix or a sequence of square matrices of equal size; "
            f"got shapes {[np.shape(m) for m in mats]}."
        )
    if len({m.shape for m in mats}) != 1:
        raise ValueError(f"jacobians have different shapes {[m.shape for m in mats]}.")
    return mats


def _check_positive(name: str, value, integer: bool = False) -> None:
    if integer:
        positive_int(name, value, numpy_ints=False)
    else:
        positive_float(name, value, finite=False)


def _first_failure(stable, tau_max: float, num_scan: int, rtol: float, batched: bool = False):
    """Scan `(0, tau_max]` uniformly, then narrow the first unstable cell to `rtol` by
    multisection with `num_scan` interior points per round (so a batched, jitted `stable` sees
    one shape only). `stable` maps an array of steps to booleans (`batched=True`) or one step to
    a boolean."""
    check = stable if batched else (lambda taus: np.array([stable(float(t)) for t in taus]))
    grid = tau_max * np.arange(1, num_scan + 1) / num_scan
    ok = np.asarray(check(grid), bool)
    if ok.all():
        return np.inf
    i = int(np.argmin(ok))
    lo, hi = (0.0 if i == 0 else float(grid[i - 1])), float(grid[i])
    while hi - lo > rtol * hi:
        pts = np.linspace(lo, hi, num_scan + 2)[1:-1]
        ok = np.asarray(check(pts), bool)
        if ok.all():
            lo = float(pts[-1])
        else:
            j = int(np.argmin(ok))
            lo, hi = (lo if j == 0 else float(pts[j - 1])), float(pts[j])
    return 0.5 * (lo + hi)


def max_stable_step_matrix(
    method,
    jacobians,
    *,
    tau_max: float,
    num_scan: int = 200,
    tol: float = 1e-10,
    rtol: float = 1e-6,
) -> float:
    r"""The predicted maximal stable step from the spectral radius of the step matrix.

    `τ*` = the first `τ` with `ρ(M(τ)) > 1 + tol`, `M` from `step_matrix`. For non-commuting
    split operators this is the only prediction (the scalar region assumes shared eigenvectors).

    **Arguments:**

    - `method`, `jacobians`: as in `step_matrix`.
    - `tau_max`: the scan range `(0, tau_max]` (positive); `inf` is returned if no instability
      is found in it.
    - `num_scan`: uniform scan points (positive integer); an unstable window narrower than
      `tau_max/num_scan` can be missed.
    - `tol`, `rtol`: tolerance on `ρ − 1` and relative bisection tolerance (positive).

    **Returns:** `τ*`.
    """
    _check_positive("tau_max", tau_max)
    _check_positive("num_scan", num_scan, integer=True)
    _check_positive("tol", tol)
    _check_positive("rtol", rtol)
    mats = _as_matrices(jacobians)

    def stable(tau):
        return np.max(np.abs(np.linalg.eigvals(step_matrix(method, mats, tau)))) <= 1 + tol

    return _first_failure(stable, tau_max, num_scan, rtol)


def _growth_scan(apply, stages, rk, u0, proj, tau, num_steps):
    """`[log(‖U_N‖/‖U_0‖), log(‖U_N‖/‖U_{N/2}‖)]` for one step size; `apply(k, U)` = `J_k U`."""

    def one(carry, _):
        u, acc = carry
        for k, a in stages:
            u = rk.step(lambda t, v, k=k: apply(k, v), 0.0, u, a * tau)
        u = proj @ u
        norm = jnp.linalg.norm(u)
        return (u / norm, acc + jnp.log(norm)), None

    start = u0 / jnp.linalg.norm(u0)
    half = num_steps // 2
    zero = jnp.zeros((), u0.dtype)
    (u, first), _ = jax.lax.scan(one, (start, zero), None, length=half)
    (_, second), _ = jax.lax.scan(one, (u, zero), None, length=num_steps - half)
    return jnp.stack([first + second, second])


@functools.partial(jax.jit, static_argnames=("rk", "stages", "num_steps"))
def _log_growth_matrices(mats, u0, proj, taus, *, rk, stages, num_steps):
    # Module-level and jitted on the matrices: one compilation per (method, shape, N), reused by
    # every call, every scan and every bisection round (the τ's are vmapped).
    def single(tau):
        return _growth_scan(lambda k, v: mats[k] @ v, stages, rk, u0, proj, tau, num_steps)

    return jax.vmap(single)(taus)


def observed_max_stable_step(
    method,
    jacobians,
    frame,
    *,
    tau_max: float,
    num_steps: int = 1000,
    growth: float = 10.0,
    projector=None,
    num_scan: int = 32,
    rtol: float = 1e-4,
    rate_tol: float = 1e-6,
) -> float:
    r"""The observed maximal stable step: bisection on the growth of the actual integration.

    `u' = Ju` (or `u' = Σ_k J_k u`, split) is integrated by the method's own `step` (an RK
    method; a splitting scheme runs its stages with its inner RK), `num_steps` steps of size
    `τ`, from every column of `frame` at once. The step is *stable* when
    `‖U_N‖ ≤ growth · ‖U_0‖` (Frobenius; the frame is renormalized every step and the log of the
    norms accumulated, so large growth never overflows) and the growth rate over the second half,
    `log(‖U_N‖/‖U_{N/2}‖)/(N/2)`, is at most `rate_tol` (it detects `|R| = 1 + δ` for any
    `δ > rate_tol`, after the transients of a non-normal `J`). `τ*` = the first unstable `τ` of a
    uniform scan of `(0, tau_max]`, refined by bisection.

    **Arguments:**

    - `method`: an explicit RK method of `workbench.schemes` or a splitting scheme.
    - `jacobians`: a matrix, a callable `v ↦ Jv` on vectors of the state size (e.g. a JVP), or
      a sequence of them (one per operator, for a splitting).
    - `frame`: initial vectors, shape `(dim, k)` (columns).
    - `tau_max`, `num_scan`, `rtol`: the scan range, scan points and bisection tolerance.
    - `num_steps`: steps per trial (positive integer); more steps resolve `τ*` more sharply
      (the error in `τ*` is about `log(growth) / (num_steps · |d log|R| / d log τ|)`).
    - `growth`: the bound on `‖U_N‖/‖U_0‖` (> 1; it must exceed the transient growth of a
      non-normal `J`).
    - `rate_tol`: the largest accepted late growth rate per step (≥ 0).
    - `projector`: optional matrix applied after every step (e.g. the spectral projector onto the
      decaying modes, which the exact step map leaves invariant: it removes only round-off).

    **Returns:** `τ*` (float; `inf` if no instability in the scan range).
    """
    _check_positive("tau_max", tau_max)
    _check_positive("num_steps", num_steps, integer=True)
    _check_positive("num_scan", num_scan, integer=True)
    _check_positive("rtol", rtol)
    positive_float("rate_tol", rate_tol, allow_zero=True, finite=False)
    number_in_range("growth", growth, 1, numpy_scalars=False, hint="a bound on ‖U_N‖/‖U_0‖")
    if isinstance(method, AbstractSplittingScheme):
        rk = method.inner
    elif isinstance(method, AbstractExplicitRK):
        rk = method
    else:
        raise ValueError(
            f"method={method!r}: the observed step needs a method with a `step`: an explicit RK "
            "of workbench.schemes (Euler(), Heun(), RK4(), ...) or a splitting scheme."
        )
    u0 = jnp.asarray(frame)
    if u0.ndim != 2:
        raise ValueError(f"frame must have shape (dim, k); got {u0.shape}.")
    items = [jacobians] if callable(jacobians) or np.ndim(jacobians) == 2 else list(jacobians)
    if not items:
        raise ValueError("jacobians is empty; pass a matrix, a callable or a sequence of them.")
    if isinstance(method, AbstractSplittingScheme):
        stages = tuple((int(k), float(a)) for k, a in method.stages(len(items)))
    else:
        stages = ((0, 1.0),)
    proj = jnp.eye(u0.shape[0], dtype=u0.dtype) if projector is None else jnp.asarray(projector)
    limit = float(np.log(growth))
    if any(callable(j) for j in items):
        ops = [j if callable(j) else (lambda v, m=jnp.asarray(j): m @ v) for j in items]
        fields = [jax.vmap(op, in_axes=1, out_axes=1) for op in ops]
        if not isinstance(method, AbstractSplittingScheme) and len(fields) > 1:
            fields = [lambda v, fs=tuple(fields): sum(f(v) for f in fs)]

        @jax.jit
        def log_growth(taus):
            apply = lambda k, v: fields[k](v)  # noqa: E731
            return jax.vmap(lambda t: _growth_scan(apply, stages, rk, u0, proj, t, num_steps))(taus)
    else:
        mats = _as_matrices(items)
        if not isinstance(method, AbstractSplittingScheme):
            mats = [sum(mats)]
        stacked = jnp.asarray(np.stack(mats), u0.dtype)

        def log_growth(taus):
            return _log_growth_matrices(
                stacked, u0, proj, taus, rk=rk, stages=stages, num_steps=num_steps
            )

    def stable(taus):
        g = np.asarray(log_growth(jnp.asarray(taus, u0.dtype)))
        total, late = g[:, 0], g[:, 1]
        # Unstable: total growth beyond the bound, or a positive growth *rate* over the second
        # half (after non-normal transients): a mode with |R| = 1 + δ shows up as soon as
        # δ > rate_tol, long before (1 + δ)^N exceeds the bound (near the imaginary axis, where
        # |R| leaves 1 slowly, the bound alone overestimates τ* by tens of per cent).
        rate = late / (num_steps - num_steps // 2)
        return np.isfinite(total) & (total <= limit) & (rate <= rate_tol)

    return _first_failure(stable, tau_max, num_scan, rtol, batched=True)


@functools.partial(jax.jit, static_argnames=("rk",))
def _modal_amplification(jac, right, left, taus, *, rk):
    # One compilation per (method, shapes). The τ's run one after another (`lax.map`): the
    # memory is one step's stages on the modes, not one copy per τ.
    def single(tau):
        out = rk.step(lambda t, v: jac @ v, 0.0, right, tau)
        return jnp.max(jnp.abs(jnp.sum(left.T * out, axis=0)))

    return jax.lax.map(single, taus)


def observed_modal_max_stable_step(
    method,
    jacobian,
    *,
    tau_max: float,
    decay_cutoff: float = 0.0,
    num_scan: int = 32,
    rtol: float = 1e-4,
    tol: float = 1e-9,
    eigen=None,
) -> float:
    r"""The observed maximal stable step on the decaying modes, from one step of the method.

    For `u' = Ju` with `J = V Λ V⁻¹`, one step of an explicit Runge–Kutta method is the matrix
    `R(τJ)`, which has the eigenvectors of `J`. The method's own `step` is applied to every
    eigenvector `v_i` of a decaying mode (`Re λ_i < −decay_cutoff`) and its observed
    amplification factor is read off with the left eigenvector `w_i` (row `i` of `V⁻¹`):
    `r_i(τ) = w_iᵀ step_τ(v_i)`, which equals `R(τλ_i)` up to round-off times the condition
    number of `V`. `τ*` = the first `τ` with `max_i |r_i(τ)| > 1 + tol`: a uniform scan of
    `(0, tau_max]`, refined by bisection.

    Unlike `observed_max_stable_step` (many steps from a frame, bisection on the growth), it
    needs no number of steps and no projector, so it resolves `τ*` on a large non-normal
    Jacobian where the growth trial cannot: a mode near the imaginary axis leaves `|R| = 1`
    slowly and is outgrown in a frame by slower decaying modes, and a projector onto the
    decaying modes of an ill-conditioned `J` leaks the growing ones back at every step. It
    checks the code of the step against the region from the Butcher data (`max_stable_step`),
    mode by mode; the growth trial checks the integration as a whole.

    **Arguments:**

    - `method`: an explicit Runge–Kutta method of `workbench.schemes` (a splitting scheme's
      step map does not keep the eigenvectors of the summed field).
    - `jacobian`: a square matrix.
    - `tau_max`: the scan range (positive); `inf` is returned if no mode is amplified in it or
      no mode decays.
    - `decay_cutoff`: modes with `Re λ < −decay_cutoff` count (≥ 0).
    - `num_scan`, `rtol`: the scan points and the relative bisection tolerance.
    - `tol`: a mode is amplified when `|r_i| > 1 + tol` (positive; above the round-off of
      `r_i`).
    - `eigen`: `(λ, V)` = `np.linalg.eig(jacobian)` when the caller has it already (e.g. one
      decomposition for several methods); computed here otherwise.

    **Returns:** `τ*` (float).
    """
    _check_positive("tau_max", tau_max)
    _check_positive("num_scan", num_scan, integer=True)
    _check_positive("rtol", rtol)
    _check_positive("tol", tol)
    positive_float("decay_cutoff", decay_cutoff, allow_zero=True, finite=False)
    if not isinstance(method, AbstractExplicitRK):
        raise ValueError(
            f"method={method!r}: the modal observation needs an explicit Runge–Kutta method of "
            "workbench.schemes (Euler(), Heun(), RK4(), ...): its step map keeps the "
            "eigenvectors of J; a splitting scheme's does not (use observed_max_stable_step)."
        )
    (jac,) = _as_matrices(jacobian)
    lam, vecs = np.linalg.eig(jac) if eigen is None else map(np.asarray, eigen)
    if lam.shape != jac.shape[:1] or vecs.shape != jac.shape:
        raise ValueError(
            f"eigen: (eigenvalues, eigenvectors) of shapes {jac.shape[:1]} and {jac.shape} "
            f"(np.linalg.eig of the jacobian); got {lam.shape} and {vecs.shape}."
        )
    keep = lam.real < -decay_cutoff
    if not keep.any():
        return np.inf
    left = np.linalg.inv(vecs)[keep]
    # The eigenvectors come from NumPy in complex128; the step runs in JAX's default complex
    # type (complex64 with x64 off: converted without a warning, and `tol` stays meaningful,
    # since the eigenvectors keep their float64 accuracy).
    args = [jnp.asarray(np.asarray(a, complex)) for a in (jac, vecs[:, keep], left)]
    real = jnp.finfo(args[0].dtype).dtype

    def stable(taus):
        amp = np.asarray(_modal_amplification(*args, jnp.asarray(taus, real), rk=method))
        return np.isfinite(amp) & (amp <= 1 + tol)

    return _first_failure(stable, tau_max, num_scan, rtol, batched=True)
