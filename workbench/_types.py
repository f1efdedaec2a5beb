"""Array aliases shared by the whole package (one home for shapes)."""

from jaxtyping import Array, Bool, Float, Int

Tokens = Float[Array, "n d"]
"""One sequence of n tokens with d features: row = token, column = feature."""
TokenIds = Int[Array, " n"]
"""Integer token ids of one sequence."""
AttentionMask = Bool[Array, "n n"]
"""`mask[i, j]` is True where token i may attend to token j."""
KeyMask = Bool[Array, " n"]
"""`mask[j]` is True where token j is a real (non-padding) token."""
Scalar = Float[Array, ""]

__all__ = ["Array", "AttentionMask", "KeyMask", "Scalar", "TokenIds", "Tokens"]
