"""Paper A's literal substep scheme for one post-norm layer with J width-d linear kernels."""

import equinox as eqx

from .._checks import int_in_range


class PaperALiteral(eqx.Module):
    r"""The literal `M = 4 + J` substep scheme of paper A (docs/recovery.md), order 1, τ = 1.

    One layer, from `u`:

    1. explicit Euler on attention: `v = u + A(u)`;
    2. projection onto S1: `z = P_{S1}(v)`;
    3. J explicit Euler steps on the linear kernels, the ReLU projection P_{S2} after each but the
       last: `w_0 = z`, `w_j = P_{S2}(w_{j−1} (I + W_j) + b_j)` for `j < J`,
       `w_J = w_{J−1} (I + W_J) + b_J`;
    4. the average of the two branches: `a = ½ (z + w_J)`;
    5. projection onto S1: `P_{S1}(a)`.

    Because `P_{S1}(c v) = P_{S1}(v)` for `c > 0` (exact projection) the ½ vanishes, and the layer
    equals the post-LN block whose feed-forward weights are `W̃_j = I + W_j`.
    """

    num_linear: int = eqx.field(static=True, default=2)

    def __check_init__(self):
        int_in_range("PaperALiteral.num_linear", self.num_linear, 1, numpy_ints=False)

    def substeps(self) -> tuple[str, ...]:
        """The M = 4 + J substeps of one layer, by name."""
        linear = tuple(f"euler(linear {j}) + relu" for j in range(1, self.num_linear))
        return (
            "euler(attention)",
            "project(S1)",
            *linear,
            f"euler(linear {self.num_linear})",
            "average",
            "project(S1)",
        )

    def order(self) -> int:
        return 1
