"""Time-stepping schemes as validated data: splittings, compositions and Runge–Kutta tableaus."""

from ._paper_a import PaperALiteral as PaperALiteral
from ._runge_kutta import (
    RK4 as RK4,
    AbstractExplicitRK as AbstractExplicitRK,
    ButcherTableau as ButcherTableau,
    Euler as Euler,
    Heun as Heun,
    Midpoint as Midpoint,
)
from ._splitting import (
    AbstractComposition as AbstractComposition,
    AbstractSplittingScheme as AbstractSplittingScheme,
    LieTrotter as LieTrotter,
    Strang as Strang,
    Suzuki4 as Suzuki4,
    Yoshida4 as Yoshida4,
)
