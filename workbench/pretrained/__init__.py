"""Real pretrained Transformers as equations: their weights loaded into the recovered models,
with their tokenizers and their sentence-level outputs (the `pretrained` extra)."""

from ._minilm import SentenceEncoder as SentenceEncoder, minilm as minilm
