"""Tokens as interacting particles on the unit sphere (paper B, docs/particles.md).

Dynamics (`SA`, `USA`, `Hardmax`, `FFNAugmented`, `AngleUSA`), sphere integrators
(`ProjectedEuler`, `ProjectedRK2`, `ProjectedRK4`, `GeodesicEuler`, `DiffraxProjected`), the entry
point `simulate`, the energy and mean-field velocity, the clustering diagnostics, the batched
phase-diagram kernel and the theory curves of the paper.

The public API is re-exported here; submodules starting with `_` are private.
"""

from ._diagnostics import (
    cluster_count as cluster_count,
    cluster_count_rank as cluster_count_rank,
    cluster_labels as cluster_labels,
    fraction_clustered as fraction_clustered,
    gram as gram,
    inner_product_histogram as inner_product_histogram,
    pair_inner_products as pair_inner_products,
)
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
    AbstractSphereIntegrator as AbstractSphereIntegrator,
    DiffraxProjected as DiffraxProjected,
    GeodesicEuler as GeodesicEuler,
    ProjectedEuler as ProjectedEuler,
    ProjectedRK2 as ProjectedRK2,
    ProjectedRK4 as ProjectedRK4,
)
from ._simulate import simulate as simulate
from ._sweeps import (
    AbstractForm as AbstractForm,
    GramForm as GramForm,
    ParticleForm as ParticleForm,
    PhaseDiagram as PhaseDiagram,
    ReducedForm as ReducedForm,
    clustering_curve as clustering_curve,
    gram_trajectory as gram_trajectory,
    phase_diagram as phase_diagram,
    random_starts as random_starts,
)
from ._theory import (
    clustering_rate_bound as clustering_rate_bound,
    gamma_beta as gamma_beta,
    gamma_infinity as gamma_infinity,
    hemisphere_margin as hemisphere_margin,
    large_beta_condition as large_beta_condition,
    large_beta_threshold as large_beta_threshold,
    tau_star as tau_star,
    wendel_probability as wendel_probability,
)
from ._time_series import (
    Plateau as Plateau,
    plateaus as plateaus,
    time_to_one_cluster as time_to_one_cluster,
)
