"""Numerical analysis of the Transformer equation: convergence order, stability, splitting error,
and paired comparisons of accuracies on the same examples.

The public API is re-exported here; submodules starting with `_` are private.
"""

from ._adaptive import adaptive_steps as adaptive_steps
from ._convergence import (
    Ladder as Ladder,
    Reference as Reference,
    error_ladder as error_ladder,
    reference_solution as reference_solution,
)
from ._order import (
    RESULTS as RESULTS,
    OrderFit as OrderFit,
    OrderFitError as OrderFitError,
    fit_order as fit_order,
    roundoff_level as roundoff_level,
)
from ._paired import (
    PairedDifference as PairedDifference,
    mcnemar_p_value as mcnemar_p_value,
    paired_difference as paired_difference,
)
from ._plan import (
    DiscretizationPlan as DiscretizationPlan,
    steps_for_tolerance as steps_for_tolerance,
)
from ._quadrature import (
    AbstractQuadratureRule as AbstractQuadratureRule,
    GaussLegendreRule as GaussLegendreRule,
    Grid as Grid,
    MidpointRule as MidpointRule,
    TrapezoidRule as TrapezoidRule,
)
from ._resolution import (
    ContinuousLayer as ContinuousLayer,
    ContinuousTransformer as ContinuousTransformer,
    SmoothFunction as SmoothFunction,
    SmoothKernel as SmoothKernel,
    folded_encoder_state_dict as folded_encoder_state_dict,
    refinement_errors as refinement_errors,
)
from ._spectra import (
    arnoldi_eigenvalues as arnoldi_eigenvalues,
    jacobian_matrix as jacobian_matrix,
    jacobian_spectrum as jacobian_spectrum,
    layer_inputs as layer_inputs,
    lipschitz_estimate as lipschitz_estimate,
    lyapunov_exponents as lyapunov_exponents,
    term_fields as term_fields,
)
from ._splitting import (
    exact_step as exact_step,
    operator_fields as operator_fields,
    splitting_step as splitting_step,
    vector_field_commutator as vector_field_commutator,
)
from ._splitting_errors import (
    global_errors as global_errors,
    local_errors as local_errors,
    splitting_flow as splitting_flow,
)
from ._stability import (
    StabilityFunction as StabilityFunction,
    max_stable_step as max_stable_step,
    max_stable_step_matrix as max_stable_step_matrix,
    observed_max_stable_step as observed_max_stable_step,
    observed_modal_max_stable_step as observed_modal_max_stable_step,
    stability_function as stability_function,
    step_matrix as step_matrix,
)
