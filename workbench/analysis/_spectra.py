r"""Jacobian spectra, Lipschitz constants and finite-time Lyapunov exponents of fields and maps.

All functions take a function `f` of one array (any shape) and differentiate it with JAX: dense
Jacobians by `jax.jacfwd` on the flattened state for small states, and matrix-free paths (Arnoldi
with JVPs, power iteration with JVP/VJP) for large ones.
"""

from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import is_int, positive_float, positive_int
from .._equation import Equation
from .._random import normal


def _flat(f: Callable, u):
    u = jnp.asarray(u)
    shape = u.shape

    def g(v):
        return jnp.ravel(f(v.reshape(shape)))

    return g, jnp.ravel(u)


@eqx.filter_jit
def _dense_jacobian(f, u):
    # `f` is a pytree (e.g. a `Partial` from `term_fields`, or an equinox bound method): models of
    # one shape share one compilation; a plain lambda is static (recompiled per object).
    g, x = _flat(f, u)
    return jax.jacfwd(g)(x)


@eqx.filter_jit
def _jvp(f, u, v):
    return jax.jvp(f, (u,), (v,))[1]


@eqx.filter_jit
def _gram_apply(f, u, v):
    """`(JᵀJv, ‖Jv‖)` for the Jacobian `J` of `f` at `u`."""
    w, vjp = jax.vjp(f, u)
    jv = jax.jvp(f, (u,), (v,))[1]
    (back,) = vjp(jv)
    return back, jnp.linalg.norm(jv)


def jacobian_matrix(f: Callable, u) -> np.ndarray:
    """The dense Jacobian `∂f/∂u` at `u` of a map between arrays of equal size, flattened
    (row-major), by `jax.jacfwd`.

    **Arguments:**

    - `f`: a function of one array, returning an array of the same size.
    - `u`: the point.

    **Returns:** a NumPy `(N, N)` matrix, `N = u.size`.
    """
    x = jnp.ravel(jnp.asarray(u))
    jac = np.asarray(_dense_jacobian(f, jnp.asarray(u)))
    if jac.shape != (x.size, x.size):
        raise ValueError(f"f maps {x.size} numbers to {jac.shape[0]}; its Jacobian is not square.")
    return jac


def jacobian_spectrum(f: Callable, u) -> np.ndarray:
    """All eigenvalues of the dense Jacobian of `f` at `u`, sorted by decreasing modulus.

    **Returns:** a complex NumPy array of length `u.size`.
    """
    ev = np.linalg.eigvals(jacobian_matrix(f, u))
    return ev[np.argsort(-np.abs(ev), kind="stable")]


def arnoldi_eigenvalues(
    f: Callable, u, *, num_eigenvalues: int = 6, krylov_dim: int = 40, key=None
) -> np.ndarray:
    r"""The largest-modulus eigenvalues of the Jacobian of `f` at `u`, matrix-free.

    Arnoldi's method: an orthonormal basis `V_m` of the Krylov space
    `span{v, Jv, …, J^{m−1}v}` built from Jacobian–vector products (`jax.linearize`, one
    linearization, `m` JVPs), with full Gram–Schmidt done twice for orthogonality; the Ritz values
    (eigenvalues of the Hessenberg `H_m = V_mᵀ J V_m`) approximate the extreme eigenvalues, the
    largest-modulus ones first. If the Krylov space becomes invariant (`h_{j+1,j} ≈ 0`) the Ritz
    values are exact and the iteration stops. With `m = u.size` they are all the eigenvalues.

    **Arguments:**

    - `f`, `u`: the map and the point.
    - `num_eigenvalues`: how many to return (positive integer ≤ `krylov_dim`).
    - `krylov_dim`: `m` (positive integer; clipped to `u.size`).
    - `key`: PRNG key for the start vector (a fixed one if `None`).

    **Returns:** complex NumPy array, decreasing modulus.
    """
    for name, value in (("num_eigenvalues", num_eigenvalues), ("krylov_dim", krylov_dim)):
        positive_int(name, value, numpy_ints=False)
    if num_eigenvalues > krylov_dim:
        raise ValueError(
            f"num_eigenvalues={num_eigenvalues} exceeds krylov_dim={krylov_dim}; raise krylov_dim."
        )
    u = jnp.asarray(u)
    x = jnp.ravel(u)

    def jvp(v):
        return jnp.ravel(_jvp(f, u, v.reshape(u.shape)))

    n = x.size
    m = min(krylov_dim, n)
    key = jax.random.key(0) if key is None else key
    v = np.asarray(normal(key, (n,), x.dtype))
    basis = np.zeros((m + 1, n))
    hess = np.zeros((m + 1, m))
    basis[0] = v / np.linalg.norm(v)
    size = m
    for j in range(m):
        w = np.asarray(jvp(jnp.asarray(basis[j])))
        scale = np.linalg.norm(w)
        for _ in range(2):  # classical Gram–Schmidt twice ("twice is enough")
            coef = basis[: j + 1] @ w
            w = w - coef @ basis[: j + 1]
            hess[: j + 1, j] += coef
        hess[j + 1, j] = np.linalg.norm(w)
        if hess[j + 1, j] <= 1e-13 * max(scale, 1e-300):
            size = j + 1  # invariant subspace: exact Ritz values
            break
        basis[j + 1] = w / hess[j + 1, j]
    ritz = np.linalg.eigvals(hess[:size, :size])
    ritz = ritz[np.argsort(-np.abs(ritz), kind="stable")]
    return ritz[:num_eigenvalues]


def lipschitz_estimate(
    f: Callable, u, *, num_iter: int = 100, key=None, rtol: float = 1e-10
) -> float:
    r"""The local Lipschitz constant `‖∂f/∂u‖₂` at `u`: the largest singular value of the
    Jacobian, by power iteration on `JᵀJ` (one JVP and one VJP per iteration, matrix-free).

    A lower bound of the Lipschitz constant of `f` on any set containing `u`; the max over
    sampled inputs is the usual empirical estimate.

    **Arguments:**

    - `f`, `u`: the map (between arrays, any shapes) and the point.
    - `num_iter`: maximum iterations (positive integer); stops early at relative change `rtol`.
    - `key`: PRNG key for the start vector (fixed if `None`).

    **Returns:** `σ_max` (float).
    """
    positive_int("num_iter", num_iter, numpy_ints=False)
    u = jnp.asarray(u)

    def apply(v):
        return _gram_apply(f, u, v)

    key = jax.random.key(0) if key is None else key
    v = normal(key, u.shape, u.dtype)
    v = v / jnp.linalg.norm(v)
    sigma = 0.0
    for _ in range(num_iter):
        back, norm_jv = apply(v)
        new = float(norm_jv)
        v = back / jnp.linalg.norm(back)
        if abs(new - sigma) <= rtol * new:
            sigma = new
            break
        sigma = new
    return float(sigma)


@eqx.filter_jit
def _push_frame(phi, u, q):
    g, x = _flat(phi, u)
    nxt, jvp = jax.linearize(g, x)
    q, r = jnp.linalg.qr(jax.vmap(jvp, in_axes=1, out_axes=1)(q))
    return nxt, q, r


def lyapunov_exponents(maps: Sequence[Callable], u0, *, num_exponents: int | None = None, key=None):
    r"""Finite-time Lyapunov exponents of a composition of maps, by the QR (Benettin) method.

    An orthonormal frame `Q_0` (`N × k`) is pushed through the Jacobian of each map along the
    orbit, `u_{l+1} = φ_l(u_l)`, `Z = Dφ_l(u_l) Q_l` (JVPs, one per column), `Z = Q_{l+1} R_l`;
    the exponents are `λ_i = (1/L) Σ_l log |(R_l)_{ii}|`, per map (per layer), in decreasing
    order. For a constant linear map `A` they tend to `log |eig(A)|` as `L` grows (exactly
    `log σ_i(A)` for a symmetric `A` when `Q_0` spans its eigenvectors).

    **Arguments:**

    - `maps`: the layer maps `φ_0, …, φ_{L−1}` (each array → array of the same shape).
    - `u0`: the starting point.
    - `num_exponents`: `k`, the frame size (default: all, `N = u0.size`).
    - `key`: PRNG key for the random start frame (fixed if `None`).

    **Returns:** `(exponents, orbit)`: a NumPy array of `k` exponents (decreasing) and the list of
    points `u_0, …, u_L`.
    """
    maps = list(maps)
    if not maps:
        raise ValueError("maps is empty; pass at least one layer map.")
    u = jnp.asarray(u0)
    n = u.size
    k = n if num_exponents is None else num_exponents
    if not (is_int(k, numpy_ints=False) and 1 <= k <= n):
        raise ValueError(f"num_exponents={num_exponents!r} must be an integer in [1, {n}].")
    key = jax.random.key(0) if key is None else key
    q, _ = jnp.linalg.qr(normal(key, (n, k), u.dtype))
    total = np.zeros(k)
    orbit = [u]
    for phi in maps:
        nxt, q, r = _push_frame(phi, u, q)
        total += np.log(np.abs(np.asarray(jnp.diag(r))))
        u = nxt.reshape(u.shape)
        orbit.append(u)
    return np.sort(total / len(maps))[::-1], orbit


@eqx.filter_jit
def _trajectory(transformer, u0):
    # One program per model structure, the weights its arguments: an eager solve would compile
    # a scan with them folded in, once for every trained model.
    return transformer.solve(u0, save_steps=True).us


def layer_inputs(transformer, u0) -> list[jax.Array]:
    r"""The state entering each layer along `transformer`'s own solve from `u0` (its scheme
    and steps per layer): `[u(0), u(T/L), …, u((L−1)T/L)]` for `L` layers, one `(n, d)` array
    each. Where a network's Jacobian spectra are taken, layer by layer (the certificate's
    largest stable step, `trained-model-analysis`). With Lie–Trotter, Euler and one step per
    layer they are the inputs of the recovered encoder's layers.

    **Arguments:**

    - `transformer`: a `wb.Transformer` with piecewise-constant controls (one piece a layer).
    - `u0`: the initial state `(n, d)`.
    """
    equation, k = transformer.equation, transformer.steps_per_layer
    if not equation.is_piecewise_constant:
        raise ValueError(
            "layer_inputs: transformer.equation has no layers (its controls are not piecewise "
            "constant); solve it with save_steps=True instead."
        )
    u0 = jnp.asarray(u0)
    us = _trajectory(transformer, u0)
    return [u0] + [us[k * (layer + 1) - 1] for layer in range(equation.num_pieces - 1)]


def term_fields(equation: Equation, t, mask=None) -> dict[str, Callable]:
    r"""The vector field of each operator of `equation` at time `t`, and the full field.

    Operator `k` contributes `placement.field(G_k(θ(t)), P_k(θ(t)), u)` (pre-norm:
    `G_k(P_k(u))`); the controls are evaluated once, at `t` (inside layer `⌊t⌋`).

    **Returns:** a dict `{"operator 0": f_0, …, "full": f}` of functions `u ↦ field`
    (`jax.tree_util.Partial`s, so the jitted helpers here compile once per model shape); names are
    `"attention"` / `"feed-forward"` for the two-operator Transformer equation.
    """
    names = (
        ("attention", "feed-forward")
        if len(equation.operators) == 2
        else tuple(f"operator {k}" for k in range(len(equation.operators)))
    )
    t = jnp.asarray(t)
    out = {}
    for k, name in enumerate(names):
        out[name] = jax.tree_util.Partial(_operator_field, equation, k, t, mask)
    out["full"] = jax.tree_util.Partial(_full_field, equation, t, mask)
    return out


def _operator_field(equation, k, t, mask, u):
    op = equation.operators[k]
    proj = None if op.projection is None else op.projection.evaluate(t)
    return equation.placement.field(op.term.evaluate(t), proj, u, mask)


def _full_field(equation, t, mask, u):
    return equation.vector_field(t, u, mask)


def matrix_with_spectrum(eigenvalues, similarity=None) -> np.ndarray:
    r"""A real matrix `J = S B S⁻¹` with the given eigenvalues: a linear test field with a known
    spectrum.

    `B` is block diagonal: a `1 × 1` block per real eigenvalue and a `2 × 2` block
    `[[a, b], [−b, a]]` per complex pair `a ± ib` (both members must be listed, in any order).
    `S` (default the identity: `J = B`, normal) makes `J` non-normal, e.g.
    `I + 0.3 · N(0, 1)/√dim`.

    **Arguments:**

    - `eigenvalues`: real or complex numbers, closed under conjugation.
    - `similarity`: an invertible `dim × dim` matrix `S`, or `None`.

    **Returns:** `J`, float64, `dim × dim`.

    **Raises:** `ValueError` when a complex eigenvalue's conjugate is missing, or `S` has the
    wrong shape.
    """
    import scipy.linalg

    eigs = np.asarray(eigenvalues, dtype=np.complex128).ravel()
    blocks, done = [], set()
    for i, lam in enumerate(eigs):
        if i in done:
            continue
        done.add(i)
        if abs(lam.imag) <= 1e-14 * max(1.0, abs(lam)):
            blocks.append(np.array([[lam.real]]))
            continue
        j = next(
            (k for k in range(len(eigs)) if k not in done and np.isclose(eigs[k], lam.conj())),
            None,
        )
        if j is None:
            raise ValueError(
                f"eigenvalues: {lam} has no conjugate {lam.conj()} in the list; a real matrix "
                "needs complex eigenvalues in conjugate pairs."
            )
        done.add(j)
        blocks.append(np.array([[lam.real, abs(lam.imag)], [-abs(lam.imag), lam.real]]))
    b = scipy.linalg.block_diag(*blocks) if blocks else np.zeros((0, 0))
    if similarity is None:
        return b
    s = np.asarray(similarity, dtype=np.float64)
    if s.shape != b.shape:
        raise ValueError(f"similarity has shape {s.shape}; it must be {b.shape}.")
    return s @ b @ np.linalg.inv(s)


def spectral_projector(jacobian, cutoff: float = 0.0) -> tuple[np.ndarray | None, int]:
    r"""The spectral projector onto the decaying modes of `J`: those with `Re λ < −cutoff`,
    along the others.

    From a sorted complex Schur form `J = Z T Z^*`, `T = [[T11, T12], [0, T22]]` with the `k`
    decaying eigenvalues in `T11`: with `X` solving the Sylvester equation `T11 X − X T22 = T12`,
    `T = V diag(T11, T22) V⁻¹` for `V = [I, −X; 0, I]`, and `P = Z [I, X; 0, 0] Z^*` (real for a
    real `J`). `P² = P`,
    `PJ = JP`, and `P` has rank `k`; the exact step map `e^{τJ}` leaves its range invariant, so
    applying `P` after every step of a linear integration removes only round-off (as in
    `observed_max_stable_step(..., projector=P)`).

    **Arguments:**

    - `jacobian`: a real square matrix `J`.
    - `cutoff`: modes with `Re λ ≥ −cutoff` count as not decaying (e.g. `1e-8 · ρ(J)`).

    **Returns:** `(P, k)`, or `(None, 0)` when no mode decays.
    """
    import scipy.linalg

    jac = np.asarray(jacobian, dtype=np.float64)
    if jac.ndim != 2 or jac.shape[0] != jac.shape[1] or not np.all(np.isfinite(jac)):
        raise ValueError(f"jacobian must be a finite square matrix; got shape {jac.shape}.")
    positive_float("cutoff", cutoff, allow_zero=True, arrays=True)
    t, z, k = scipy.linalg.schur(jac, output="complex", sort=lambda x: x.real < -cutoff)
    if k == 0:
        return None, 0
    if k == jac.shape[0]:
        return np.eye(k), int(k)
    x = scipy.linalg.solve_sylvester(t[:k, :k], -t[k:, k:], t[:k, k:])
    left = np.hstack([np.eye(k), x])  # rows of the block-diagonalizing inverse
    return np.real(z[:, :k] @ left @ z.conj().T), int(k)
