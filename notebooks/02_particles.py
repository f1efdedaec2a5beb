# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # 2. Tokens as particles on the sphere
#
# Paper B (Geshkovski, Letrouit, Polyanskiy, Rigollet, *A mathematical perspective on
# Transformers*, arXiv:2312.10794; figure and theorem numbers of its version 4) strips a
# Transformer down to its attention and its normalization: tokens are points
# $x_i(t) \in S^{d-1}$, $i = 1, \dots, n$, moving by the self-attention dynamics (SA)
#
# $$\dot x_i = P^\perp_{x_i}\Big(\frac{1}{Z_i}\sum_{j=1}^n e^{\beta\langle Q x_i, K x_j\rangle}\, V x_j\Big),
# \qquad Z_i = \sum_{k=1}^n e^{\beta\langle Q x_i, K x_k\rangle},$$
#
# where $P^\perp_x y = y - \langle x, y\rangle x$ keeps each token on the sphere and $\beta$ is an
# inverse temperature. With $Q = K = V = I$ the interaction energy
# $E_\beta(x) = \frac{1}{2\beta n^2}\sum_{i,j} e^{\beta\langle x_i, x_j\rangle}$ grows along the
# flow, and the tokens *cluster*: their pairwise inner products move to 1. In the language of
# paper A (Tai, Liu, Li, Chan, arXiv:2510.03989) the sphere plays the role of the normalization's
# constraint set and the particle system is the projected ODE "advance, then project" converges
# to; the authors' integrator — an Euler step, then renormalize every row — is the Lie
# splitting of attention and constraint (`wb.particles.ProjectedEuler`).

# %%
# %matplotlib inline
import jax

# Float64 for the particle runs (clustering thresholds such as 1 − 10⁻⁴ sit close to 1); the
# notebook's choice, the library never flips the precision itself.
jax.config.update("jax_enable_x64", True)

import equinox as eqx
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display

import workbench as wb

P = wb.particles


def show(figures):
    """Display a study's figures (a dict of matplotlib Figures made without pyplot)."""
    for fig in figures.values():
        display(fig)


# %% [markdown]
# ## One run on the circle
#
# Thirty-two uniform random tokens on the circle ($d = 2$), SA with $Q = K = V = I$, the
# authors' projected Euler step $dt = 0.1$. We record the angles, the energy $E_\beta$, the
# number of clusters (connected components of $\langle x_i, x_j\rangle > 1 - 10^{-4}$) and the
# fraction of pairs within $\delta = 10^{-3}$ of each other (the statistic of paper B's Fig. 3).
# At β = 1 everything collapses to one point quickly; at β = 4 the tokens first gather in a
# few clusters that then merge very slowly — the metastability of paper B's Fig. 4.

# %%
x0 = P.random_starts(jax.random.key(0), 1, 32, 2)[0]  # (n, d) = (32, 2), unit rows
ts = np.arange(0.0, 30.01, 0.5)

fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
for beta, color in ((1.0, "C0"), (4.0, "C3")):
    xs = P.simulate(P.SA(beta), x0, t1=30.0, dt=0.1, save_ts=ts)  # (times, n, d)
    angles = np.unwrap(np.asarray(jax.vmap(P.to_angles)(xs)), axis=0)
    energy = np.asarray(jax.vmap(lambda x, b=beta: P.interaction_energy(x, b))(xs))
    clusters = np.asarray(jax.vmap(P.cluster_count)(xs))
    axes[0].plot(ts, angles, color=color, lw=0.6)
    axes[1].plot(ts, energy / energy[0], color=color, label=f"β = {beta:g}")
    axes[2].step(ts, clusters, where="post", color=color, label=f"β = {beta:g}")
    print(
        f"β = {beta:g}: clusters at t = 30: {clusters[-1]}, "
        f"fraction of close pairs {float(P.fraction_clustered(xs[-1])):.2f}"
    )
    assert np.all(np.diff(energy) >= -1e-12 * energy[0]), "E_β must not decrease along SA"
    if beta == 1.0:
        assert clusters[-1] == 1
axes[0].set(xlabel="t", ylabel="angle θ_i(t)", title="trajectories (blue β = 1, red β = 4)")
axes[1].set(xlabel="t", ylabel="E_β(x(t)) / E_β(x(0))", title="energy grows")
axes[2].set(xlabel="t", ylabel="clusters", yscale="log", title="cluster count")
axes[1].legend()
plt.show()

# %% [markdown]
# ## The phase diagram (paper B, Fig. 3 and Fig. 5)
#
# Averaging the fraction of close pairs over many random starts, for a grid of β and t, gives
# the clustering phase diagram: a sharp front between "not yet clustered" and "one cluster".
# Paper B's Thm 6.9 predicts the front in high dimension: with an i.i.d. uniform start all Gram
# entries track the solution $\gamma_\beta(t)$ of the orthogonal start (Thm 6.8), so the front is
# approximated by the curve $\Gamma_\infty = \{(t, \beta) : \gamma_\beta(t) = 1 - \delta\}$
# (`wb.particles.gamma_infinity`). Fig. 5 repeats the experiment with random $Q, K, V$. The
# `phase-diagram` study at smoke size (d = 8 and 32, 8 starts per β, one random-matrix variant)
# already shows the front approaching $\Gamma_\infty$ as d grows.

# %%
from studies.particles import phase_diagram as pd

sa = eqx.filter_vmap(P.SA)(jnp.array([1.0, 4.0, 9.0]))  # one SA per β
print("Γ_∞ time t*(β) for β = 1, 4, 9 (n = 32):", np.round(P.gamma_infinity(sa), 1))
phase = pd.compute(pd.smoke_config())
print(pd.verdict(phase))
show(pd.figures(phase))

# %% [markdown]
# ## Where the mass goes, and for how long (Fig. 1's statistic, Fig. 4)
#
# Paper B's Fig. 1 histograms the pairwise inner products of a trained Transformer's normalized
# token states layer by layer and sees the mass pile up at 1 (notebook 5 repeats it on a real
# model). The `cluster-histograms` study computes the same statistic for the particle model,
# with time in the role of depth. The `metastability` study follows runs on the circle over a
# long horizon (paper B, Fig. 4) and measures how long the multi-cluster plateaus last.

# %%
from studies.particles import cluster_histograms as ch

hist = ch.compute(ch.smoke_config())
print(ch.verdict(hist))
show(ch.figures(hist))

# %%
from studies.particles import metastability as ms

meta = ms.compute(ms.smoke_config())
print(ms.verdict(meta))
show(ms.figures(meta))
