r"""A training run's identity: what determines its trajectory, as JSON-able data, written into
the run folder and every checkpoint and compared on resume (`Checkpoints`)."""

import json

import jax
import numpy as np

from ._checkpoint import array_text, describe, params_sha256

__all__ = ["run_fingerprint"]


def run_fingerprint(model, data, *, train_step, opt_state, seed, batch_size, steps) -> dict:
    """What determines a run's trajectory, as a JSON-able dict (compared on resume):

    - `model`: the model's structure — every module and static field (activation, scheme,
      steps per layer, ...) and the dtype and shape of every parameter array (not the initial
      values: a model initialized on another platform may differ in the last bits);
    - `optimizer`: the structure, dtypes and shapes of the initial state of the step's update
      rule, the values of its injected hyperparameters at step 0, and the arguments recorded on
      its `init` function (`init.arguments`: `default_optimizer` records its own). An optax
      transformation is a pair of functions, which cannot be compared: two optimizers of the
      same state structure whose behaviour differs otherwise (`sgd(0.1)` and `sgd(0.2)`, or the
      peak of a schedule warming up from 0) are not told apart here; pass such settings in
      `Checkpoints`' `fingerprint`.
    - `objective`, `method`, `augment`, `discretization`, `max_skipped`: the step's, with
      every number (`describe`);
    - `data`: the number of examples, the inputs' and targets' dtype and shape and a SHA-256 of
      their contents;
    - `seed`, `batch_size`, `steps`.
    """
    hyperparams = [
        {k: describe(v) for k, v in state.hyperparams.items()}
        for state in jax.tree.leaves(opt_state, is_leaf=lambda x: hasattr(x, "hyperparams"))
        if hasattr(state, "hyperparams")
    ]
    inputs, targets = np.asarray(data.inputs), np.asarray(data.targets)
    rule = train_step.method.optimizer(train_step.optimizer)
    return as_json(
        {
            "model": describe(model, array_values=False),
            "optimizer": {
                "state": describe(opt_state, array_values=False),
                "hyperparams": hyperparams,
                "arguments": getattr(rule.init, "arguments", None),
            },
            "objective": describe(train_step.objective),
            "method": describe(train_step.method),
            "augment": describe(train_step.augment),
            "discretization": describe(train_step.discretization),
            "max_skipped": train_step.max_skipped,
            "data": {
                "examples": len(data),
                "inputs": array_text(inputs),
                "targets": array_text(targets),
                "sha256": params_sha256((inputs, targets)),
            },
            "seed": int(seed),
            "batch_size": int(batch_size),
            "steps": int(steps),
        }
    )


def as_json(value):
    """`value` as it reads back from JSON (tuples become lists), for comparisons with a file."""
    return json.loads(json.dumps(value))
