"""diffrax solvers for the Transformer equation: the classical RK4 tableau and the projection
wrapper for constrained (post-norm) equations."""

from ._projected import ProjectedSolver as ProjectedSolver
from ._rk4 import ClassicalRK4 as ClassicalRK4
