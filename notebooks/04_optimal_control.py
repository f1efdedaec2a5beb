# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # 4. Training as optimal control
#
# Paper A (Tai, Liu, Li, Chan, *A Mathematical Explanation of Transformers*, arXiv:2510.03989,
# §5) states training as an optimal-control problem for the equation: the weights are the
# controls $\theta(t)$, the input enters the initial condition, the loss is read off the final
# state,
#
# $$\min_\theta \frac1B\sum_{i=1}^B \ell\big(\mathrm{head}(u_i(T)), y_i\big)
# \quad\text{subject to}\quad \partial_t u_i = A(u_i;\theta(t)) + F(u_i;\theta(t)),\;
# u_i(0) = \mathrm{embed}(x_i).$$
#
# `wb.control` offers three routes to a descent direction, all behind
# `value_and_direction(objective, model, xs, ys)`:
#
# - **discretize, then optimize** (`wb.control.DiscretizeThenOptimize`): the exact gradient of
#   the discrete network, by reverse mode through the scheme's steps — ordinary backprop;
# - **optimize, then discretize** (`wb.control.OptimizeThenDiscretize`): the continuous adjoint.
#   The costate $\lambda = \partial J/\partial u$ solves $\lambda_t = -(\partial_u f)^\top\lambda$
#   backward from $\lambda(T) = \nabla\ell$, and the gradient of layer $l$ is
#   $\int_{\text{layer } l}(\partial_\theta f)^\top\lambda\,dt$; solved with the model's own
#   scheme it differs from the exact discrete gradient by $O(\tau^p)$;
# - **the method of successive approximations** (`wb.control.SuccessiveApproximations`), from
#   Pontryagin's maximum principle: a forward state, a backward costate, then every layer's
#   controls improved at once on that layer's Hamiltonian (extended with penalties when
#   `rho > 0`).
#
# Then the discretization itself is planned before training (which scheme and how many steps
# per layer meet a tolerance) and checked after training by a certificate, since training
# moves the weights the plan was made for.

# %%
# %matplotlib inline
import jax

# Float64 for the gradient comparison and the certificate; the studies switch precision
# themselves where it matters (training runs in float32). The notebook's choice; the library
# never flips the precision itself.
jax.config.update("jax_enable_x64", True)

import dataclasses
import json
import pathlib
import tempfile
import warnings

from IPython.display import display

import workbench as wb

wba, wbc = wb.analysis, wb.control


def show(figures):
    """Display a study's figures (a dict of matplotlib Figures made without pyplot)."""
    for fig in figures.values():
        display(fig)


# %% [markdown]
# ## The continuous adjoint converges to backprop at the scheme's order
#
# The `adjoint-accuracy` study takes a small pre-norm GELU equation with random controls, a
# random classifier on the class token and random inputs, and measures the relative gap between
# the continuous-adjoint gradient and the exact discrete gradient on a ladder of steps per
# layer. With Strang splitting (order 2) the gap should fall like $\tau^2$. (Its second part,
# the time and memory of each method against depth, is left out here to keep the run short.)

# %%
from studies.training import adjoint_accuracy as aa

adj = aa.compute(
    dataclasses.replace(aa.smoke_config(), schemes=("strang",), cost_methods=(), repeats=1)
)
print(aa.verdict(adj))
for ladder in adj.ladders:
    print(
        f"{ladder.method}: relative gaps {[f'{g:.1e}' for g in ladder.relative_gaps]} "
        f"at {ladder.steps_per_layer} steps per layer; observed order {ladder.observed_order:.2f}"
    )
    assert abs(ladder.observed_order - ladder.declared_order) <= 0.3
with warnings.catch_warnings():  # the cost figures are empty here (their part was skipped)
    warnings.simplefilter("ignore", UserWarning)
    display(aa.figures(adj)["orders"])

# %% [markdown]
# ## Pontryagin instead of a gradient
#
# The `msa-vs-gradient` study trains a small digits model (a pre-norm ViT-style equation on
# 2×2 patches) with Adam on the exact gradient and with the extended method of successive
# approximations (Li, Chen, Tai & E, 2018), and compares the objective per iteration and per
# second of training. At this tiny size (two
# layers, 20 iterations, the objective logged every 10) it only shows the mechanics; the full
# study runs 600 iterations of a four-layer model.

# %%
from studies.training import msa_vs_gradient as mv

msa = mv.compute(
    dataclasses.replace(mv.smoke_config(), steps=20, window=2, include_basic=False),
    run_dir=None,
)
print(mv.verdict(msa))
show(mv.figures(msa))

# %% [markdown]
# ## Plan in, certificate out
#
# **Plan.** The `plan` study finds, for a model of given sizes (with random weights, before any
# training) and a tolerance, the cheapest method and number of steps per layer whose error at
# $T$ (against a refined Dopri8 solve) meets the tolerance: a pilot ladder per method gives
# $e \approx C\tau^p$, the predicted step count is checked and raised until the measured error
# meets it, and the step is compared with the largest linearly stable step from the Jacobian
# spectra along the trajectory. It writes a `plan.json` (`wb.analysis.DiscretizationPlan`) that
# training reads. Training runs splitting schemes, so the candidates here are Lie–Trotter and
# Strang.
#
# **Train.** The `train-digits` study trains a ViT-style equation on scikit-learn's 8×8 digits
# (Hugging Face ViT embedding of 4×4 patches, two layers, d = 32), solved with the plan's scheme
# and steps for every batch (`depth="fixed"`; training over several step counts is the next
# section's subject).
#
# **Certificate.** After training, `wb.control.certify` measures in float64 whether the *trained*
# network is still a faithful discretization of its equation: its error against a refined
# solve, the observed order on a ladder, the largest stable step of its spectra, and whether the
# plan's tolerance still holds for the trained weights.

# %%
from studies.numerics import plan as pl
from studies.training import train_digits as td

model = dataclasses.replace(
    td.smoke_config(), embedding="vit", patch_size=4, epochs=6, target_accuracy=0.4, depth="fixed"
)  # 8×8 digits in 4×4 patches: 4 tokens and a class token
planned = pl.compute(
    dataclasses.replace(
        pl.smoke_config(),
        d=model.d,
        num_layers=model.num_layers,
        num_heads=model.num_heads,
        dim_feedforward=model.hidden,
        methods=("lie", "strang"),
        tolerance=3e-2,
    )
)
print(pl.verdict(planned))
display(pl.figures(planned)["plan"])

tmp = tempfile.TemporaryDirectory()  # removed at the end of the notebook
run = pathlib.Path(tmp.name)
(run / "plan.json").write_text(json.dumps(pl.artifacts(planned)["plan.json"]))
plan = wba.DiscretizationPlan.load(run / "plan.json")
print(
    f"plan: {plan.method}, {plan.steps_per_layer} steps per layer "
    f"(measured error {plan.measured_error:.1e} ≤ tolerance {plan.tolerance:g})"
)

# %%
trained = td.compute(dataclasses.replace(model, plan=str(run / "plan.json")), run_dir=None)
print(td.verdict(trained))
show(td.figures(trained))

cert = trained.certificate
order = "no fit" if cert["observed_order"] is None else f"{cert['observed_order']:.2f}"
stable = f"{cert['step']:.3g} ≤ {cert['largest_stable_step']:.3g}: {cert['stable']}"
holds = (
    f"{cert['plan_holds']} (error {cert['plan_error']:.1e} at tolerance {cert['plan_tolerance']:g})"
)
print(
    f"certificate of the trained network: {cert['scheme']}, {cert['steps_per_layer']} steps per layer"
)
print(f"  error against the refined solve   {cert['error']:.2e}")
print(f"  observed order on the ladder      {order} (expected {cert['expected_order']})")
print(f"  step ≤ largest stable step        {stable}")
print(f"  the plan still holds              {holds}")
assert cert["plan_method"] == plan.method and cert["stable"]
tmp.cleanup()

# %% [markdown]
# ## Continuous depth: is the trained network a solution of its equation?
#
# A network trained at one Lie–Trotter step per layer can be an excellent discrete map and a
# poor discretization: solve the same controls with more steps and its accuracy falls
# (Queiruga et al., *Continuous-in-Depth Neural Networks*, 2020). Training every batch at a
# step count drawn from $\{1, 2, 4\}$ per layer (`wbc.MultiResolution((1, 2, 4))` as the
# `discretization` of `wbc.TrainStep`), with the kinetic cost $\lambda_K\int\frac1n\|u_t\|^2dt$,
# makes controls that do well on every grid. The `continuous-depth` study trains both recipes
# and solves each trained network at 1–16× its steps per layer and with Strang at 16×; at full
# size (`workbench run continuous-depth`) the multi-resolution network stays within half a
# point. Here at a tiny size (d = 16, two layers, a few epochs), so the accuracies are low, but
# the difference between the recipes already shows.

# %%
from studies.training import continuous_depth as cd

depth = cd.compute(
    dataclasses.replace(
        cd.smoke_config(), tolerances=(1e-1,), adaptive_solvers=("heun",), timing_repeats=1
    )
)
print(cd.verdict(depth))
display(cd.figures(depth)["refinement"])
one, multi = depth.config.recipes.index("one-step"), depth.config.recipes.index("multi-resolution")
print(
    f"spread under refinement: one-step {100 * depth.spread[one]:.1f} points, "
    f"multi-resolution {100 * depth.spread[multi]:.1f} points"
)
assert depth.spread[multi] < depth.spread[one]
