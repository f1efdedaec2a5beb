"""Value tests of `workbench.analysis` stability tools: stability polynomials from Butcher data,
predicted vs observed maximal stable steps on linear fields with known spectra, dense vs
matrix-free spectra, Lipschitz and Lyapunov oracles, and bad input."""

import dataclasses
import math
import re

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import workbench as wb
from studies._toolkit.config import ConfigError
from studies._toolkit.report import have_matplotlib
from studies.numerics import stability
from workbench import analysis as wa
from workbench.analysis._spectra import matrix_with_spectrum, spectral_projector

from helpers import small_encoder

S = wb.schemes


@pytest.mark.parametrize(
    "method, coeffs",
    [
        (S.Euler(), [1, 1]),
        (S.Heun(), [1, 1, 1 / 2]),
        (S.Midpoint(), [1, 1, 1 / 2]),
        (S.RK4(), [1, 1, 1 / 2, 1 / 6, 1 / 24]),
        (diffrax.Ralston(), [1, 1, 1 / 2]),
        (diffrax.Bosh3(), [1, 1, 1 / 2, 1 / 6]),
        (diffrax.Dopri5(), [1, 1, 1 / 2, 1 / 6, 1 / 24, 1 / 120, 1 / 600]),
    ],
)
def test_stability_polynomials(method, coeffs):
    r = wa.stability_function(method)
    np.testing.assert_allclose(r.coefficients, coeffs, rtol=1e-13, atol=1e-15)
    # R(z) = 1 + z bᵀ(I − zA)⁻¹1 evaluated directly, at complex points.
    z = np.array([-2.5 + 0.3j, 0.7j, -1.0])
    tab = S.RK4.tableau if isinstance(method, S.RK4) else None
    if tab is not None:
        a, b = tab.a_matrix, np.asarray(tab.b)
        direct = [1 + zz * b @ np.linalg.solve(np.eye(4) - zz * a, np.ones(4)) for zz in z]
        np.testing.assert_allclose(r(z), direct, rtol=1e-13)


def test_splitting_region_commuting_case():
    # Lie with Euler sub-steps on two commuting operators, λ_k = z/2: (1 + z/2)².
    r = wa.stability_function(S.LieTrotter(), weights=(0.5, 0.5))
    np.testing.assert_allclose(r.coefficients, [1, 1, 0.25], atol=1e-15)
    # Strang with exact-ish commuting pieces is the product of the midpoint polynomials.
    z = np.array([-1.3 + 0.4j])
    mid = wa.stability_function(S.Midpoint())
    r2 = wa.stability_function(S.Strang(), weights=(0.3, 0.7))
    np.testing.assert_allclose(r2(z), mid(0.15 * z) ** 2 * mid(0.7 * z), rtol=1e-13)
    # The matrix step map of commuting diagonal operators has those eigenvalues.
    j1, j2 = np.diag([-1.0, -2.0]), np.diag([-3.0, -0.5])
    m = wa.step_matrix(S.Strang(), [j1, j2], 0.4)
    expect = mid(0.2 * np.diag(j1)) ** 2 * mid(0.4 * np.diag(j2))
    np.testing.assert_allclose(np.diag(m), expect.real, rtol=1e-13)


def test_predicted_steps_closed_form():
    L = 7.0
    assert wa.max_stable_step(S.Euler(), [-L]) == pytest.approx(2 / L, rel=1e-12)
    assert wa.max_stable_step(S.Heun(), [-L]) == pytest.approx(2 / L, rel=1e-12)
    assert wa.max_stable_step(S.RK4(), [-L]) == pytest.approx(2.785293563405 / L, rel=1e-10)
    # RK4 on the imaginary axis: |R(iy)| ≤ 1 up to y = 2√2; Euler/Heun never.
    assert wa.max_stable_step(S.RK4(), [3j]) == pytest.approx(2 * math.sqrt(2) / 3, rel=1e-9)
    assert wa.max_stable_step(S.Euler(), [3j]) == 0.0
    assert wa.max_stable_step(S.Heun(), [0.1 - 1j]) == 0.0
    # Euler on λ = −a + ib: |1 + τλ| = 1 at τ = 2a/|λ|².
    lam = -1.5 + 2.0j
    assert wa.max_stable_step(S.Euler(), [lam]) == pytest.approx(3 / abs(lam) ** 2, rel=1e-12)
    assert wa.max_stable_step(S.RK4(), [0.0]) == math.inf


def _matrix_with_spectrum(eigs, rng):
    blocks = []
    for lam in eigs:
        if lam.imag > 0:
            blocks.append(np.array([[lam.real, lam.imag], [-lam.imag, lam.real]]))
        elif lam.imag == 0:
            blocks.append(np.array([[lam.real]]))
    d = scipy.linalg.block_diag(*blocks)
    s = np.eye(len(d)) + 0.3 * rng.normal(size=d.shape) / np.sqrt(len(d))
    return s @ d @ np.linalg.inv(s)


@pytest.mark.parametrize("kind", ["real", "complex"])
def test_predicted_vs_observed_within_two_percent(kind, rng):
    if kind == "real":
        eigs = -np.geomspace(0.1, 10.0, 8) + 0j
    else:
        pairs = np.geomspace(0.5, 10.0, 4) * np.exp(1j * np.linspace(0.55, 0.95, 4) * np.pi)
        eigs = np.concatenate([pairs, pairs.conj()])
    jac = _matrix_with_spectrum(eigs, rng)
    np.testing.assert_allclose(
        np.sort_complex(np.linalg.eigvals(jac)), np.sort_complex(eigs), atol=1e-9
    )
    for method in (S.Euler(), S.Heun(), S.RK4()):
        pred = wa.max_stable_step(method, eigs)
        obs = wa.observed_max_stable_step(
            method, jac, np.eye(8), tau_max=3 * pred, num_steps=2000, growth=1e3
        )
        assert abs(obs / pred - 1) <= 0.02, (type(method).__name__, pred, obs)
        # Prediction from the step matrix's spectral radius agrees with the polynomial roots.
        pm = wa.max_stable_step_matrix(method, jac, tau_max=3 * pred)
        assert pm == pytest.approx(pred, rel=1e-5)


def test_modal_observation_resolves_modes_near_the_imaginary_axis_next_to_growing_ones(rng):
    """A non-normal field like a trained layer's linearization: decaying pairs close to the
    imaginary axis (`|R|` leaves 1 slowly there), fast decaying modes and growing ones. One
    step of the method's own `step` on each decaying eigenvector finds the τ* of the
    polynomial roots to the bisection tolerance (1e-4), for every method; with no decaying
    mode nothing can be amplified (inf)."""
    pairs = np.array([-0.01 + 2j, -0.05 + 1j, -0.2 + 0.5j])
    eigs = np.concatenate([pairs, pairs.conj(), [-0.5, -2.0, -5.0, 0.3, 1.0]])
    jac = _matrix_with_spectrum(eigs, rng)
    decaying = eigs[eigs.real < 0]
    for method in (S.Euler(), S.Heun(), S.RK4()):
        pred = wa.max_stable_step(method, decaying)
        obs = wa.observed_modal_max_stable_step(method, jac, tau_max=3 * pred, decay_cutoff=1e-8)
        assert abs(obs / pred - 1) <= 2e-4, (type(method).__name__, pred, obs)
    assert wa.observed_modal_max_stable_step(S.RK4(), np.eye(3), tau_max=1.0) == np.inf
    # A decomposition passed in gives the same τ* as the one computed inside (bit for bit).
    pred = wa.max_stable_step(S.Heun(), decaying)
    alone = wa.observed_modal_max_stable_step(S.Heun(), jac, tau_max=3 * pred, decay_cutoff=1e-8)
    given = wa.observed_modal_max_stable_step(
        S.Heun(), jac, tau_max=3 * pred, decay_cutoff=1e-8, eigen=np.linalg.eig(jac)
    )
    assert given == alone


@pytest.mark.float32
def test_modal_observation_runs_in_the_default_precision_without_a_warning(rng):
    """In float32 (x64 off, the CI's second pass) the step runs in complex64 and no dtype
    warning is raised; Euler's τ* near the imaginary axis and RK4's stay within 1 % of the
    polynomial roots (measured: 4e-4 and 4e-5)."""
    import warnings

    pairs = np.array([-0.01 + 2j])
    eigs = np.concatenate([pairs, pairs.conj(), [-0.5, -2.0, 0.3]])
    jac = _matrix_with_spectrum(eigs, rng)
    for method in (S.Euler(), S.RK4()):
        pred = wa.max_stable_step(method, eigs[eigs.real < 0])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            obs = wa.observed_modal_max_stable_step(method, jac, tau_max=3 * pred)
        assert abs(obs / pred - 1) <= 0.01, (type(method).__name__, pred, obs)


def test_splitting_non_commuting_observed_matches_matrix_prediction(rng):
    q1, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    q2, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    mats = [
        -q1 @ np.diag(np.geomspace(0.1, 1, 6)) @ q1.T,
        -q2 @ np.diag(np.geomspace(0.3, 3, 6)) @ q2.T,
    ]
    pred = wa.max_stable_step_matrix(S.LieTrotter(), mats, tau_max=4.0)
    obs = wa.observed_max_stable_step(S.LieTrotter(), mats, np.eye(6), tau_max=4.0, num_steps=2000)
    assert abs(obs / pred - 1) <= 0.02


@pytest.fixture(scope="module")
def prenorm():
    _, m = small_encoder(
        np.random.default_rng(3), d=8, heads=2, layers=2, dff=12, norm_first=True, activation="gelu"
    )
    u = jnp.asarray(np.random.default_rng(4).normal(size=(4, 8)))
    return m, u


@pytest.mark.slow
def test_dense_vs_arnoldi_and_term_sum(prenorm):
    m, u = prenorm
    fields = wa.term_fields(m.equation, 0.5)
    dense = wa.jacobian_spectrum(fields["full"], u)
    ritz = wa.arnoldi_eigenvalues(fields["full"], u, num_eigenvalues=4, krylov_dim=u.size)
    np.testing.assert_allclose(ritz, dense[:4], atol=1e-8 * abs(dense[0]))
    # The full Jacobian is the sum of the per-operator ones (the field is their sum).
    js = {k: wa.jacobian_matrix(f, u) for k, f in fields.items()}
    np.testing.assert_allclose(js["attention"] + js["feed-forward"], js["full"], atol=1e-12)
    # ... and the field itself is the equation's.
    np.testing.assert_allclose(fields["full"](u), m.equation.vector_field(0.5, u), atol=1e-14)


def test_lipschitz_of_linear_map_is_spectral_norm(rng):
    a = rng.normal(size=(5, 7))
    est = wa.lipschitz_estimate(lambda v: jnp.asarray(a) @ v, jnp.ones(7), num_iter=500)
    assert est == pytest.approx(np.linalg.norm(a, 2), rel=1e-8)


def test_lyapunov_of_constant_linear_map(rng):
    q, _ = np.linalg.qr(rng.normal(size=(4, 4)))
    sym = q @ np.diag([2.0, 1.0, 0.5, 0.25]) @ q.T
    a = jnp.asarray(sym)
    # Finite L: exactly (1/L) log|diag R| of QR(A^L Q_0), Q_0 the function's start frame.
    exps, orbit = wa.lyapunov_exponents([lambda v: a @ v] * 10, jnp.ones(4))
    q0, _ = jnp.linalg.qr(jax.random.normal(jax.random.key(0), (4, 4), jnp.float64))
    r = np.linalg.qr(np.linalg.matrix_power(sym, 10) @ np.asarray(q0))[1]
    np.testing.assert_allclose(exps, np.sort(np.log(np.abs(np.diag(r))) / 10)[::-1], atol=1e-12)
    np.testing.assert_allclose(orbit[-1], np.linalg.matrix_power(sym, 10) @ np.ones(4), rtol=1e-12)
    # Long horizon: log singular values (= log|eig|, symmetric), error O(1/L).
    exps, _ = wa.lyapunov_exponents([lambda v: a @ v] * 2000, jnp.ones(4))
    np.testing.assert_allclose(exps, np.log([2.0, 1.0, 0.5, 0.25]), atol=2e-3)
    # Non-normal map with known eigenvalues: exponents tend to log|eig|.
    t = np.array([[1.5, 3.0], [0.0, 0.5]])
    exps, _ = wa.lyapunov_exponents([lambda v: jnp.asarray(t) @ v] * 2000, jnp.ones(2))
    np.testing.assert_allclose(exps, np.log([1.5, 0.5]), atol=3e-3)


def test_bad_input():
    with pytest.raises(ValueError, match="no explicit Butcher tableau"):
        wa.stability_function(object())
    with pytest.raises(ValueError, match="implicit"):
        wa.stability_function(diffrax.Kvaerno3())
    with pytest.raises(ValueError, match="tol=-1"):
        wa.max_stable_step(S.Euler(), [-1.0], tol=-1)
    with pytest.raises(ValueError, match="NaN"):
        wa.max_stable_step(S.Euler(), [np.nan])
    with pytest.raises(ValueError, match="tau_max=0"):
        wa.observed_max_stable_step(S.Euler(), -np.eye(2), np.eye(2), tau_max=0)
    with pytest.raises(ValueError, match="num_steps=0"):
        wa.observed_max_stable_step(S.Euler(), -np.eye(2), np.eye(2), tau_max=1.0, num_steps=0)
    with pytest.raises(ValueError, match="growth=0.5"):
        wa.observed_max_stable_step(S.Euler(), -np.eye(2), np.eye(2), tau_max=1.0, growth=0.5)
    with pytest.raises(ValueError, match="needs a method with a `step`"):
        wa.observed_max_stable_step(diffrax.Tsit5(), -np.eye(2), np.eye(2), tau_max=1.0)
    with pytest.raises(ValueError, match="the modal observation needs an explicit Runge–Kutta"):
        wa.observed_modal_max_stable_step(S.LieTrotter(), -np.eye(2), tau_max=1.0)
    with pytest.raises(ValueError, match="decay_cutoff=-1"):
        wa.observed_modal_max_stable_step(S.Euler(), -np.eye(2), tau_max=1.0, decay_cutoff=-1)
    with pytest.raises(ValueError, match="tol=0"):
        wa.observed_modal_max_stable_step(S.Euler(), -np.eye(2), tau_max=1.0, tol=0)
    with pytest.raises(ValueError, match="square"):
        wa.observed_modal_max_stable_step(S.Euler(), np.ones((2, 3)), tau_max=1.0)
    with pytest.raises(ValueError, match=r"eigen: .* got \(3,\) and \(2, 2\)"):
        wa.observed_modal_max_stable_step(
            S.Euler(), -np.eye(2), tau_max=1.0, eigen=(np.ones(3), np.eye(2))
        )
    with pytest.raises(ValueError, match="weights"):
        wa.stability_function(S.Strang(), weights=())
    with pytest.raises(ValueError, match="square"):
        wa.step_matrix(S.Euler(), np.ones((2, 3)), 0.1)
    with pytest.raises(ValueError, match="krylov_dim"):
        wa.arnoldi_eigenvalues(lambda v: v, jnp.ones(3), num_eigenvalues=5, krylov_dim=4)


def test_matrix_with_spectrum_and_spectral_projector(rng):
    eigs = np.array([-2.0, -0.5, 0.3, -1.0 + 2.0j, -1.0 - 2.0j, 0.2 - 1.0j, 0.2 + 1.0j])
    s = np.eye(7) + 0.3 * rng.normal(size=(7, 7)) / np.sqrt(7)
    jac = matrix_with_spectrum(eigs, similarity=s)
    assert jac.dtype == np.float64
    np.testing.assert_allclose(
        np.sort_complex(np.linalg.eigvals(jac)), np.sort_complex(eigs), atol=1e-12
    )
    # Without a similarity the matrix is the real block form itself (normal).
    block = matrix_with_spectrum(eigs[3:5])
    np.testing.assert_allclose(block, [[-1.0, 2.0], [-2.0, -1.0]])
    with pytest.raises(ValueError, match="no conjugate"):
        matrix_with_spectrum([-1.0 + 2.0j, -1.0])
    # The projector onto the 4 decaying modes: idempotent, commutes with J, rank 4, and J on its
    # range has exactly the decaying eigenvalues.
    p, k = spectral_projector(jac, cutoff=1e-8)
    assert k == 4
    np.testing.assert_allclose(p @ p, p, atol=1e-12)
    np.testing.assert_allclose(p @ jac, jac @ p, atol=1e-12)
    assert np.linalg.matrix_rank(p, tol=1e-8) == 4
    on_range = np.linalg.eigvals(jac @ p)
    kept = np.sort_complex(on_range[np.abs(on_range) > 1e-9])
    np.testing.assert_allclose(kept, np.sort_complex(eigs[eigs.real < 0]), atol=1e-10)
    assert spectral_projector(np.eye(3)) == (None, 0)  # no mode decays
    np.testing.assert_allclose(spectral_projector(-np.eye(3))[0], np.eye(3))


# ----------------------------------------------------------------------------------------------
# The study, at its smoke size


@pytest.fixture(scope="module")
def results():
    return stability.compute(stability.smoke_config())


def test_study_numbers(results):
    for row in results.linear:
        # Every linear case, including eigenvalues near the imaginary axis (the rate criterion).
        assert abs(row.rel_diff) <= 0.02, row
    assert results.linear_max_abs_rel_diff <= 0.02
    for layer in results.model:
        assert layer.arnoldi_rel_error < 1e-5
        assert layer.num_decaying + layer.num_growing <= 8 * 4
        for r in layer.steps.values():
            assert abs(r.rel_diff) <= 0.05, r
        assert layer.steps["unsplit-rk4"].rel_diff < 0.02
    assert results.lipschitz.vs_beta[-1] > results.lipschitz.vs_beta[0]
    # The region polynomials: RK4's is the same for the tableau and the diffrax solver.
    np.testing.assert_allclose(
        results.rk_regions["unsplit-rk4"], [1, 1, 1 / 2, 1 / 6, 1 / 24], rtol=1e-13
    )
    np.testing.assert_allclose(results.split_regions["lie[Euler]"], [1, 1, 0.25], atol=1e-15)


def test_verdict_yes_on_smoke(results):
    text = stability.verdict(results)
    assert text.startswith("Yes. "), text
    assert "(tolerance 0.02)" in text and "(tolerance 0.05)" in text


def test_verdict_flips(results):
    bad = dataclasses.replace(
        results.linear[0], observed=2 * results.linear[0].predicted, rel_diff=1.0
    )
    linear = dataclasses.replace(results, linear=[bad, *results.linear[1:]])
    assert stability.verdict(linear).startswith("Partly. "), stability.verdict(linear)
    layer = results.model[0]
    steps = {k: dataclasses.replace(r, rel_diff=float("nan")) for k, r in layer.steps.items()}
    model = [dataclasses.replace(layer, steps=steps), *results.model[1:]]
    both = dataclasses.replace(linear, model=model)
    assert stability.verdict(both).startswith("No. "), stability.verdict(both)
    assert "NOT met" in stability.verdict(both)


def test_report_and_figures(results):
    text = stability.report(results)
    assert "| split (non-commuting) | LieTrotter[Euler] |" in text
    assert f"largest {results.lyapunov_exponents[0]:.4g}" in text
    if have_matplotlib():
        figs = stability.figures(results)
        assert set(figs) == {
            "stability_regions",
            "spectra",
            "max_stable_step",
            "lipschitz",
            "lyapunov",
        }
        labels = [t.get_text() for t in figs["stability_regions"].axes[0].get_legend().texts]
        assert labels[:5] == ["unsplit-euler", "unsplit-heun", "unsplit-rk4", "tsit5", "dopri5"]


@pytest.mark.parametrize(
    "change, match",
    [
        ({"methods": ("rk4",)}, "methods=('rk4',) is not allowed; valid choices: 'unsplit-euler'"),
        ({"methods": ()}, "methods=() is not allowed; give at least one value"),
        ({"splittings": ("trotter",)}, "splittings=('trotter',) is not allowed; valid choices"),
        ({"linear_dim": 3}, "linear_dim=3 is not allowed; allowed range [4, inf)"),
        ({"growth": 1.0}, "growth=1.0 is not allowed; allowed range (1, inf)"),
        (
            {"betas": (0.5, -1.0)},
            "betas=(0.5, -1.0) is not allowed; every value must be finite and > 0",
        ),
        ({"heads": 3}, "heads=3 is not allowed; it must divide d=8: [1, 2, 4, 8]"),
        (
            {"linear_rate_tol": -1e-4},
            "linear_rate_tol=-0.0001 is not allowed; every value must be finite and >= 0",
        ),
        ({"amplification_tol": 0.0}, "amplification_tol=0.0 is not allowed"),
        ({"linear_tolerance": 0.0}, "linear_tolerance=0.0 is not allowed"),
    ],
)
def test_bad_config(change, match):
    with pytest.raises(ConfigError, match=re.escape(match)):
        dataclasses.replace(stability.smoke_config(), **change)


def test_cli_rejects_bad_config_before_any_folder(tmp_path):
    from studies._run.cli import main

    out = tmp_path / "x"
    assert main(["run", "stability", "--smoke", "--out", str(out), "--methods", "rk4"]) == 2
    assert not out.exists()


@pytest.mark.filterwarnings("ignore:rediscretize:UserWarning")  # post-norm + Strang, on purpose
@pytest.mark.parametrize("norm_first", [False, True])
def test_layer_inputs_are_the_inputs_of_the_encoders_layers(norm_first, rng):
    """Lie–Trotter, Euler, one step per layer: the state entering layer `l` is the output of
    the first `l` layers of `torch.nn.TransformerEncoder` (the direct NumPy forward, 1e-12);
    at three steps per layer, the states of the model's own solve at layer boundaries."""
    sd, m = small_encoder(rng, layers=3, norm_first=norm_first)
    u = rng.normal(size=(5, 12))
    got = wb.analysis.layer_inputs(m, u)
    assert len(got) == 3
    for layer in range(3):
        if layer == 0:
            want = u
        else:
            first = {k: v for k, v in sd.items() if int(k.split(".")[1]) < layer}
            want = wb.architectures.direct_encoder(first, u, num_heads=3, norm_first=norm_first)
        np.testing.assert_allclose(np.asarray(got[layer]), want, atol=1e-12, err_msg=str(layer))
    fine = m.rediscretize(scheme=wb.schemes.Strang(), steps_per_layer=3)
    us = fine.solve(jnp.asarray(u), save_steps=True).us
    np.testing.assert_array_equal(np.asarray(wb.analysis.layer_inputs(fine, u)[2]), us[5])
