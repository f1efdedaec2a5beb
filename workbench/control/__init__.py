r"""Training as optimal control of the Transformer equation (docs/control.md).

A `TrainStep` (an optax optimizer, an `Objective` — a terminal loss through a readout head plus
running costs on the trajectory and the controls —, a gradient method, an augmentation) is one
pure step of a `ControlledModel` (embedding → equation → head); `train` runs it over seeded
batches and devices, with checkpoints and exact resume, metrics, evaluation and progress.
"""

from ._adjoint import OptimizeThenDiscretize as OptimizeThenDiscretize
from ._certificate import (
    certify as certify,
    refinement_accuracy as refinement_accuracy,
)
from ._checkpoint import CheckpointMismatch as CheckpointMismatch
from ._data import Dataset as Dataset
from ._discretizations import (
    MultiResolution as MultiResolution,
    OwnDiscretization as OwnDiscretization,
)
from ._gradients import (
    AbstractGradientMethod as AbstractGradientMethod,
    DiscretizeThenOptimize as DiscretizeThenOptimize,
)
from ._inference import adaptive_accuracy as adaptive_accuracy
from ._models import (
    ClassifierHead as ClassifierHead,
    ControlledModel as ControlledModel,
    PatchEmbedding as PatchEmbedding,
    SequenceHead as SequenceHead,
    TokenEmbedding as TokenEmbedding,
    coarsen_depth as coarsen_depth,
    extend_depth as extend_depth,
    interpolate_controls as interpolate_controls,
    random_transformer as random_transformer,
    random_vit as random_vit,
    refine_depth as refine_depth,
    vit_classifier as vit_classifier,
)
from ._msa import SuccessiveApproximations as SuccessiveApproximations
from ._objective import (
    AbstractControlCost as AbstractControlCost,
    AbstractTerminalLoss as AbstractTerminalLoss,
    Acceleration as Acceleration,
    ControlNorm as ControlNorm,
    ControlSmoothness as ControlSmoothness,
    CrossEntropy as CrossEntropy,
    KineticEnergy as KineticEnergy,
    Objective as Objective,
)
from ._optimizer import default_optimizer as default_optimizer
from ._results import (
    RESULTS as RESULTS,
    TrainingDiverged as TrainingDiverged,
    TrainResult as TrainResult,
)
from ._saved_models import (
    load_run as load_run,
    save_model as save_model,
)
from ._tasks import (
    Task as Task,
    digits as digits,
    mnist1d as mnist1d,
    mnist5000 as mnist5000,
    sorting as sorting,
)
from ._train_step import TrainState as TrainState, TrainStep as TrainStep
from ._trainer import evaluate as evaluate, train as train
