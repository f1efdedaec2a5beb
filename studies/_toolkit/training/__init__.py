"""What the training studies share, one idea a module: `recipe` (a config's names -> checked
fields and library objects), `identity` (what makes two runs the same run), `certificate` (the
trained network against its equation, float64) and `outcome` (a run's results, times, verdict
and figure). A study imports this package as `T` and calls `T.train_step(...)`,
`T.fingerprint(...)`, ..."""

from .certificate import (
    certificate as certificate,
    certificate_artifacts as certificate_artifacts,
    certificate_lines as certificate_lines,
    consistency_text as consistency_text,
    order_verdict as order_verdict,
    refinement_ladder as refinement_ladder,
    to_float64 as to_float64,
)
from .identity import (
    ANALYSIS_FIELDS as ANALYSIS_FIELDS,
    LAYOUT_FIELDS as LAYOUT_FIELDS,
    fingerprint as fingerprint,
    study_id as study_id,
    subfolder as subfolder,
)
from .outcome import (
    curve as curve,
    history as history,
    solve_seconds as solve_seconds,
    solve_seconds_side_by_side as solve_seconds_side_by_side,
    training_figure as training_figure,
    training_results as training_results,
    training_seconds as training_seconds,
    training_verdict as training_verdict,
)
from .recipe import (
    BASES as BASES,
    CHECKPOINTING as CHECKPOINTING,
    CONTROLS as CONTROLS,
    DEPTH as DEPTH,
    GRADIENTS as GRADIENTS,
    NESTED as NESTED,
    ONE_PIECE as ONE_PIECE,
    OPTIMIZERS as OPTIMIZERS,
    activation as activation,
    check_coarsen as check_coarsen,
    check_depth_fields as check_depth_fields,
    check_model_fields as check_model_fields,
    check_resolutions as check_resolutions,
    check_training_fields as check_training_fields,
    digits_model as digits_model,
    discretization as discretization,
    gradient_method as gradient_method,
    load_plan as load_plan,
    multi_resolution as multi_resolution,
    objective as objective,
    optimizer as optimizer,
    read_plan as read_plan,
    train_step as train_step,
    with_controls as with_controls,
)
