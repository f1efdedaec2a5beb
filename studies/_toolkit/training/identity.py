"""What makes two runs of a training study the same run (compared on resume, in `run.json` and
in every checkpoint), and the folders of a study's several trainings inside its run folder."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from .recipe import read_plan


def study_id(module: str) -> str:
    """A training study's name in its run identity: `studies.<module>`, the study module's own
    name whichever theme subpackage holds it (`studies.training.train_digits` ->
    `studies.train_digits`). The identity is recorded in the run folder and in every checkpoint,
    and a rerun resumes only a run of the same identity: leaving the theme out keeps a study's
    run folders its own when the study moves to another theme."""
    return "studies." + module.rsplit(".", 1)[-1]


LAYOUT_FIELDS = ("shard_params", "checkpoint_every")
"""Config fields of how a run is executed and saved, not what it computes: a run resumes with
other values (any device layout and count, another checkpoint interval)."""


ANALYSIS_FIELDS = {
    "studies.train_digits": ("certificate_examples", "target_accuracy", "max_spread"),
    "studies.train_sequence": ("certificate_examples", "target_accuracy", "max_spread"),
    "studies.depth_refinement": ("ladder", "examples", "max_change"),
    "studies.regularization_cost": ("plan_scheme", "tolerance", "ladder", "examples", "max_drop"),
    "studies.msa_vs_gradient": ("window", "max_excess"),
    "studies.continuous_depth": (
        "certificate_examples",
        "target_accuracy",
        "max_spread",
        "tolerances",
        "adaptive_solvers",
        "adaptive_margin",
        "timing_repeats",
    ),
    "studies.trained_model_analysis": (
        "certificate_examples",
        "target_accuracy",
        "max_spread",
        "num_exponents",
        "fine_factor",
        "lyapunov_tolerance",
        "tolerance",
        "plan_methods",
    ),
    "studies.scheme_architectures": (
        "certificate_examples",
        "target_accuracy",
        "max_spread",
        "timing_repeats",
    ),
}
"""Per training study (its `study_id`), the config fields read only after training — the
certificate, the error ladder of the trained model, the verdict's thresholds, the averaging
window — so changing them neither changes a trained trajectory nor blocks a resume. Fields that
choose *which* trainings run (`kinetic_weights`, `include_basic`, ...) stay in the identity."""


def fingerprint(config: Any) -> dict:
    """The run's identity, JSON-able: the study (`study_id` of its module) and every config field
    that decides the trained trajectories. Left out: `LAYOUT_FIELDS` and the study's `ANALYSIS_FIELDS`. The
    plan enters by its contents (`{"method", "steps_per_layer", "sha256"}` of the plan read
    back), not its path: a plan regenerated at the same path is another run; a plan moved
    elsewhere is the same. `wbc.train` adds the model, optimizer, data and seed it sees to this
    (its own fingerprint), and a study's trainings add their variant."""
    import hashlib
    import json

    study = study_id(type(config).__module__)
    skip = set(LAYOUT_FIELDS) | set(ANALYSIS_FIELDS.get(study, ()))
    fields = {k: v for k, v in dataclasses.asdict(config).items() if k not in skip}
    # Absent while they have no effect (no coarse draws, or coarse draws weighted like the
    # others): a run whose config lacks them, or sets them to no effect, has one identity.
    if not fields.get("coarsen") or fields.get("coarse_weight") == 1.0:
        fields.pop("coarse_weight", None)
    if fields.get("coarsen") == ():
        del fields["coarsen"]
    # Absent at its default: a digits run's identity is the same whether or not its config
    # has the field, so run folders written without it resume.
    if fields.get("task") == "digits":
        del fields["task"]
    if fields.get("basis") == "layers":
        del fields["basis"]
    if fields.get("acceleration") == 0.0:
        del fields["acceleration"]
    if fields.get("plan") is not None:
        plan = read_plan(config)
        text = json.dumps(plan.to_dict(), sort_keys=True)
        fields["plan"] = {
            "method": plan.method,
            "steps_per_layer": plan.steps_per_layer,
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
        }
    return json.loads(json.dumps({"study": study, **fields}))


def subfolder(run_dir, name: str):
    """`run_dir / name` (None without a run folder): one durable training run of a study."""
    return None if run_dir is None else pathlib.Path(run_dir) / name
