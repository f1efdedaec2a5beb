"""workbench: Transformers as discretized differential equations, in JAX.

The public API is re-exported here; submodules starting with `_` are private.
"""

from . import (
    analysis as analysis,
    architectures as architectures,
    control as control,
    io as io,
    particles as particles,
    pretrained as pretrained,
    registry as registry,
    schemes as schemes,
    solvers as solvers,
    terms as terms,
)
from ._bases import (
    AbstractBasis as AbstractBasis,
    Legendre as Legendre,
    LegendreBasis as LegendreBasis,
    PiecewiseConstantBasis as PiecewiseConstantBasis,
    PiecewiseLinearBasis as PiecewiseLinearBasis,
)
from ._checkpointing import (
    AbstractCheckpointing as AbstractCheckpointing,
    BinomialCheckpointing as BinomialCheckpointing,
    CheckpointEvery as CheckpointEvery,
    NoCheckpointing as NoCheckpointing,
)
from ._controls import (
    AbstractControl as AbstractControl,
    Constant as Constant,
    Interpolated as Interpolated,
    PiecewiseConstant as PiecewiseConstant,
    stack as stack,
)
from ._equation import (
    AbstractPlacement as AbstractPlacement,
    Equation as Equation,
    Operator as Operator,
    PostNorm as PostNorm,
    PreNorm as PreNorm,
)
from ._formulations import (
    AbstractFormulation as AbstractFormulation,
    Natural as Natural,
    Penalty as Penalty,
    Projected as Projected,
)
from ._hypernetwork import (
    Hypernetwork as Hypernetwork,
    HypernetworkBasis as HypernetworkBasis,
)
from ._integrate import integrate as integrate
from ._sharding import map_cells as map_cells
from ._solution import RESULTS as RESULTS, Solution as Solution
from ._step import step as step
from .architectures._model import to_basis as to_basis

__version__ = "0.1.0"
