# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # 1. Exact recovery: a Transformer *is* one discretization of an equation
#
# Paper A (Tai, Liu, Li, Chan, *A Mathematical Explanation of Transformers*, arXiv:2510.03989)
# reads a Transformer as a differential equation in depth,
#
# $$u_t = A(u; \theta(t)) + F(u; \theta(t)), \qquad u(0) = \text{embedding of the input},$$
#
# with $A$ the attention operator, $F$ the feed-forward operator, and the layer norm a projection
# onto a constraint set (paper A, Theorem 3.1). One Lie–Trotter step of size τ = 1 per layer —
# an explicit Euler substep for each operator, then the projection — reproduces
# `torch.nn.TransformerEncoder`, BERT, GPT-2 and ViT to round-off. The same equation, solved with
# another scheme or more steps, is a different (continuous-depth) model.
#
# This notebook checks the recovery against independent implementations (a direct NumPy
# forward pass, and PyTorch / Hugging Face when the `reference` extra is installed), then
# re-discretizes a ViT. Open it with `jupytext --to notebook notebooks/01_exact_recovery.py`
# (the `notebooks` extra).

# %%
# %matplotlib inline
import jax

# Float64: round-off agreement (1e-15) and observed orders need it. This is the notebook's
# choice; the library never flips the precision itself.
jax.config.update("jax_enable_x64", True)

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display

import workbench as wb

A = wb.architectures
rng = np.random.default_rng(0)
print("PyTorch / Hugging Face reference available:", A.have_reference())

# %% [markdown]
# ## A post-LN encoder from a plain NumPy state dict
#
# `random_encoder_state_dict` draws weights with the keys and shapes of
# `torch.nn.TransformerEncoder.state_dict()`; `encoder_from_torch` builds the equation and its
# controls from them. The check is against `direct_encoder`, a plain NumPy forward pass written
# independently of the equation code, and against torch itself when available.

# %%
sd = A.random_encoder_state_dict(rng, d=36, num_layers=4, dim_feedforward=64)
m = A.encoder_from_torch(sd, num_heads=4, norm_first=False, activation="relu")
u = rng.standard_normal((16, 36))  # 16 tokens of width 36
y = np.asarray(m(u))

err_direct = np.abs(y - A.direct_encoder(sd, u, num_heads=4)).max()
print(f"encoder vs direct NumPy: {err_direct:.1e}")
assert err_direct < 1e-10
if A.have_reference():
    err_torch = np.abs(y - A.run_reference(A.torch_encoder(sd, num_heads=4), u)).max()
    print(f"encoder vs torch:        {err_torch:.1e}")
    assert err_torch < 1e-10

# %% [markdown]
# ## A Vision Transformer
#
# Hugging Face's `ViTModel` is a *pre-norm* equation: the layer norm sits inside each operator,
# $u_t = A(P(u)) + F(P(u))$, and the final LayerNorm is the output map. The image enters only
# the initial condition: the patch embedding is an integral operator over each patch, plus a
# class token and position embeddings. Here a 12 × 8 image in 4 × 4 patches gives 6 patch
# tokens and the class token.

# %%
cfg = A.vit_config(
    d=24, num_heads=4, num_layers=4, intermediate=48, image_size=(12, 8), patch_size=(4, 4)
)
sd_vit = A.random_vit_state_dict(rng, cfg)
image = rng.standard_normal((cfg["num_channels"], 12, 8))
vit = A.vit_from_hf(sd_vit, cfg)
y_vit = np.asarray(vit(image))
print("ViT tokens (class token first):", y_vit.shape)

err_direct = np.abs(y_vit - A.direct_vit(sd_vit, cfg, image)).max()
print(f"ViT vs direct NumPy:   {err_direct:.1e}")
assert err_direct < 1e-10
if A.have_reference():
    err_hf = np.abs(y_vit - A.run_reference(A.hf_vit(sd_vit, cfg), image)).max()
    print(f"ViT vs Hugging Face:   {err_hf:.1e}")
    assert err_hf < 1e-10

# %% [markdown]
# ## The same equation, other discretizations
#
# `rediscretize` keeps the equation and its controls and changes the scheme or the number of
# steps per layer. On the pre-norm ViT equation the field is smooth (GELU), so refining the step
# converges to the continuous-depth model — not to the network, which is the coarsest member
# of the family. Successive differences $\|y_k - y_{2k}\|_\infty$ then shrink by $2^p$ per
# halving, $p$ the scheme's order: Lie–Trotter 1, Strang 2, Yoshida 4.
#
# Post-norm models (BERT, the encoder above) behave differently. Each post-norm layer ends with a
# projection onto its LayerNorm's constraint set, and every splitting "sub-flow, then project"
# is only first-order accurate for the constrained equation whatever the scheme; a BERT layer
# also alternates two *different* LayerNorms, which have no common continuous limit. Refining a
# post-norm network therefore converges at order 1 at best. For a high-order solve of the
# continuous post-norm equation, integrate the projected ODE on the last norm's constraint set:
# `wb.integrate(m.equation, u, solver, num_steps=..., formulation=wb.Projected())`.

# %%
ladder = (2, 4, 8)
diffs = {}
for scheme in (wb.schemes.LieTrotter(), wb.schemes.Strang(), wb.schemes.Yoshida4()):
    outs = [np.asarray(vit.rediscretize(scheme=scheme, steps_per_layer=k)(image)) for k in ladder]
    d = [np.abs(a - b).max() for a, b in zip(outs[:-1], outs[1:])]
    observed = np.log2(d[0] / d[1])
    name = type(scheme).__name__
    diffs[name] = d
    print(f"{name:10s} successive differences {d[0]:.2e} {d[1]:.2e}  observed order {observed:.2f}")
    assert abs(observed - scheme.order()) < 0.3, (name, observed)

fig, ax = plt.subplots(figsize=(5, 3.5))
for name, d in diffs.items():
    ax.loglog([1 / k for k in ladder[:-1]], d, "o-", label=name)
ax.set_xlabel("step τ = 1 / steps per layer")
ax.set_ylabel("max |y_k − y_2k|")
ax.set_title("ViT re-discretized")
ax.legend()
plt.show()

# %% [markdown]
# ## The study, without a run folder
#
# A study is a computation (`compute` → typed `Results`), its figures, a report and a verdict
# computed from the numbers; `workbench run exact-recovery --smoke` writes the same to a folder.
# Its smoke size covers the encoders, BERT, GPT-2, ViT, CvT and paper A's literal substep
# scheme, in float32 and float64.

# %%
import studies.models.exact_recovery as study

results = study.compute(study.smoke_config())
verdict = study.verdict(results)
print(verdict)
assert verdict.startswith("Yes"), verdict
for fig in study.figures(results).values():
    display(fig)
