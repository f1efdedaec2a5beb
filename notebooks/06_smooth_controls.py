# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # 6. Controls that are functions of depth-time
#
# A network's weights are a *piecewise-constant* control: $\theta(t) = \theta_l$ on layer $l$.
# The field of the equation $u_t = \sum_k G_k(u;\theta(t))$ jumps at every layer boundary, so an
# adaptive solver must stop at each one, and the only compression is merging layers. Here the
# controls live in a smooth basis instead, Legendre polynomials on $[0, T]$,
#
# $$\theta(t) = \sum_{k \le p} \sqrt{2k+1}\, P_k(2t/T - 1)\, c_k ,$$
#
# with $p + 1$ coefficients $c_k$, each one layer's worth of parameters. We map a network into
# that basis (the $L^2$ projection of its layers), train a small model in it on the digits, and
# watch an adaptive solver step across several layers' worth of depth at once.

# %%
# %matplotlib inline
import diffrax
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import workbench as wb

wba, wbc = wb.analysis, wb.control

# %% [markdown]
# ## A network's layers in the Legendre basis
#
# `wb.to_basis(model, wb.LegendreBasis(7))` projects every control of an 8-layer network onto
# polynomials of degree 7 (8 coefficients: the same number of parameters). The projection is
# exact where the bases are nested: onto degree 11 and back onto degree 7, nothing changes;
# onto degree 3, the first four coefficients are kept (the compression).

# %%
key = jax.random.key(0)
network = wbc.random_transformer(key, d=16, num_heads=2, num_layers=8, hidden=32)
smooth = wb.to_basis(network, wb.LegendreBasis(7))
layers, legendre = network.equation.operators[1].term, smooth.equation.operators[1].term
ts = np.linspace(0, 8, 400)
entry = lambda c: np.array([float(c.evaluate(t).hidden[0, 0]) for t in ts])

back = legendre.project(wb.LegendreBasis(11)).project(wb.LegendreBasis(7))
gap = max(
    float(jnp.max(jnp.abs(a - b)))
    for a, b in zip(jax.tree.leaves(back.values), jax.tree.leaves(legendre.values))
)
print(f"degree 7 -> 11 -> 7 changes the coefficients by {gap:.1e}")
assert gap < 1e-5

fig, ax = plt.subplots(figsize=(6.5, 3.2))
ax.plot(ts, entry(layers), label="a network's layers (piecewise constant)")
ax.plot(ts, entry(legendre), label="its projection onto degree 7")
ax.plot(ts, entry(legendre.project(wb.LegendreBasis(3))), "--", label="onto degree 3 (compressed)")
ax.set(xlabel="depth-time t", ylabel=r"one entry of $W_1(t)$")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## Train a model whose controls are polynomials in depth
#
# The model is one piece over $[0, T]$ ($T = 8$ layers' worth), so its step counts are steps
# over the whole depth and need not be multiples of anything. Every batch is solved on a grid
# drawn from 4, 6, 8 or 12 Lie–Trotter steps, or with half the coefficients and half the steps
# (`coarsen=(2,)`), so that the trained controls are those of the equation and not of one grid.

# %%
task = wbc.digits(0)
k1, k2 = jax.random.split(jax.random.key(1))
model = wbc.ControlledModel(
    wbc.PatchEmbedding((8, 8), 32, kernel_size=3, padding=1, key=k1),
    wbc.random_transformer(
        k2, d=32, num_heads=2, num_layers=8, hidden=64, basis=wb.LegendreBasis(7)
    ),
    wbc.ClassifierHead(32, 10),
)
steps = 400
step = wbc.TrainStep(
    wbc.default_optimizer(6e-3, steps=steps, warmup=40),
    objective=wbc.Objective(
        wbc.CrossEntropy(), wbc.KineticEnergy(0.05), (wbc.ControlSmoothness(0.1),)
    ),
    discretization=wbc.MultiResolution((4, 6, 8, 12), coarsen=(2,)),
)
result = wbc.train(step, model, task.train, steps=steps, batch_size=64, seed=2, progress=False)
trained = result.model
accuracy = wbc.evaluate(trained, task.test)
print(f"held-out accuracy at its own grid (8 Lie steps over [0, 8]): {100 * accuracy:.2f} %")
assert accuracy > 0.85

# %% [markdown]
# The same controls solved on other grids, and compressed: the first 4 coefficients (the $L^2$
# projection onto degree 3) with 4 steps, no data and no retraining.

# %%
lie = wb.schemes.LieTrotter()
for n in (3, 5, 8, 13, 64):
    acc = wbc.evaluate(trained.rediscretize(lie, n), task.test)
    print(f"{n:3d} Lie steps: {100 * acc:.2f} %")
half = wbc.coarsen_depth(trained, 2).rediscretize(lie, 4)
print(f"half the coefficients, 4 steps: {100 * wbc.evaluate(half, task.test):.2f} %")

# %% [markdown]
# ## Where an adaptive solver steps
#
# `wb.analysis.adaptive_steps` solves one example's equation over $[0, T]$ with an embedded pair
# (Bosh3) under a PID controller and returns its accepted steps. The smooth model is solved in
# one go; the same controls projected onto 8 layers jump at every boundary, which are declared
# to the solver, so none of its steps can be longer than a layer.

# %%
u0 = trained.embedding(jnp.asarray(task.test.inputs[0]))
as_layers = wb.to_basis(trained, wb.PiecewiseConstantBasis(8))
fig, ax = plt.subplots(figsize=(6.5, 3.4))
for color, (name, m) in zip(
    ("C0", "C1"), (("Legendre (smooth)", trained), ("8 layers", as_layers))
):
    s = wba.adaptive_steps(m.transformer.equation, u0, solver=diffrax.Bosh3(), rtol=3e-2, atol=3e-2)
    print(
        f"{name}: {s.accepted} accepted steps, {s.rejected} rejected, "
        f"{s.evaluations} field evaluations"
    )
    label = f"{name}: {s.accepted} steps, {s.evaluations} evaluations"
    ax.stairs(s.sizes, s.times, color=color, lw=2, label=label)
    ax.plot(s.times[:-1], s.sizes, "o", color=color)
    if name.startswith("Legendre"):
        smooth_steps = s
ax.axhline(1.0, color="gray", lw=0.8)
ax.set(xlabel="depth-time t", ylabel="accepted step size", ylim=(0, None))
ax.legend(fontsize=8)
plt.show()
assert abs(smooth_steps.sizes.sum() - 8.0) < 1e-4
