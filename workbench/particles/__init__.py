"""Tokens as interacting particles on the unit sphere (paper B, docs/particles.md).

Dynamics (`SA`, `USA`, `Hardmax`, `FFNAugmented`, `AngleUSA`), sphere integrators
(`ProjectedEuler`, `ProjectedRK2`, `ProjectedRK4`, `GeodesicEuler`, `DiffraxProjected`), the entry
point `simulate`, and the energy and mean-field velocity.
"""

from ._dynamics import (
    SA as SA,
    USA as USA,
    AbstractDynamics as AbstractDynamics,
    AngleUSA as AngleUSA,
    FFNAugmented as FFNAugmented,
    Hardmax as Hardmax,
    from_angles as from_angles,
    interaction_energy as interaction_energy,
    mean_field_velocity as mean_field_velocity,
    tangent as tangent,
    to_angles as to_angles,
)
from ._integrators import (
    INTEGRATORS as INTEGRATORS,
    AbstractProjectedRK as AbstractProjectedRK,
    AbstractSphereIntegrator as AbstractSphereIntegrator,
    DiffraxProjected as DiffraxProjected,
    GeodesicEuler as GeodesicEuler,
    ProjectedEuler as ProjectedEuler,
    ProjectedRK2 as ProjectedRK2,
    ProjectedRK4 as ProjectedRK4,
)
from ._simulate import simulate as simulate
from ._starts import half_time as half_time, uniform_sphere as uniform_sphere

# isort: split
# The diagnostics and theory modules (written alongside) export their own `__all__`.
from ._diagnostics import *  # noqa: F401,F403  (diagnostics: Gram, cluster counts, ...)
from ._sweeps import *  # noqa: F401,F403  (the batched phase-diagram kernel)
from ._theory import *  # noqa: F401,F403  (theory curves: gamma_beta, Wendel, ...)
from ._time_series import *  # noqa: F401,F403  (plateaus, count summaries, exponential rates)
