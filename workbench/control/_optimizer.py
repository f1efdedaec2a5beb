r"""The default optimizer: AdamW after global-norm clipping, with a linear warm-up and a cosine
decay of the learning rate, whose numbers are *state*, not constants of the compiled step.

The rate at update $c$ (counted from 0), peak $\eta$, warm-up $w$, $S$ steps in all and a final
fraction $\phi$ (so $\alpha = \phi$, $D = \max(S, w + 1) - w$):

$$\eta_c = \begin{cases} \eta\,c/w & c < w,\\
\eta\big((1-\alpha)\tfrac12(1 + \cos(\pi\min(c - w, D)/D)) + \alpha\big) & c \ge w,\end{cases}$$

optax's `warmup_cosine_decay_schedule(0, η, w, w + D, αη)` (the same values, to rounding: it is
computed here in float64 when x64 is on, then cast to the parameters' dtype).
The peak, warm-up, length, weight decay and clipping norm live in the optimizer state as
arrays, so the training step is the same program for every choice of them: a sweep over
learning rates or step counts compiles it once (with JAX's persistent compilation cache, once
across processes too), where constants closed over by the step would make each setting a new
program.
"""

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

__all__ = ["DefaultOptimizerState", "default_optimizer"]


class DefaultOptimizerState(NamedTuple):
    """The state of `default_optimizer`.

    - `count`: updates applied (int32).
    - `hyperparams`: `learning_rate` (the rate of the latest update; before any, the first
      one's), `weight_decay` and `clip`, in the parameters' dtype: what the trainer logs and
      what a run's fingerprint compares.
    - `schedule`: the schedule's numbers (`peak`, `warmup`, `decay_steps`, `alpha`,
      `one_minus_alpha`), read by every update.
    - `inner_state`: AdamW's state (moments and its own count).
    """

    count: jax.Array
    hyperparams: dict[str, jax.Array]
    schedule: dict[str, jax.Array]
    inner_state: Any


def _rate(count, s: dict[str, jax.Array]) -> jax.Array:
    """The learning rate at update `count`, computed in the schedule's float dtype (float64
    with x64 on; the parameters' dtype is applied after)."""
    f = s["peak"].dtype
    c, w = count.astype(f), s["warmup"].astype(f)
    rising = s["peak"] * (jnp.clip(c, 0, w) / jnp.maximum(w, 1))  # unused when w = 0
    after = jnp.minimum(c - w, s["decay_steps"])
    cosine = 0.5 * (1 + jnp.cos(jnp.pi * after / s["decay_steps"]))
    falling = s["peak"] * (s["one_minus_alpha"] * cosine + s["alpha"])
    return jnp.where(count < s["warmup"], rising, falling)


def _update(updates, state, params=None):
    """`default_optimizer`'s update: every number it needs is in `state`, so one function serves
    every optimizer `default_optimizer` makes (and a training step compiled for one serves
    all)."""
    h = state.hyperparams
    rate = _rate(state.count, state.schedule).astype(optax.tree.dtype(params, "highest"))
    # optax.clip_by_global_norm's arithmetic, with the norm cast to each update's dtype:
    # a run-time `clip` array is not weakly typed, as a Python float would be.
    g_norm = optax.tree.norm(updates)
    trigger = jnp.squeeze(g_norm < h["clip"])
    updates = jax.tree.map(
        lambda t: jax.lax.select(
            trigger, t, (t / g_norm.astype(t.dtype)) * h["clip"].astype(t.dtype)
        ),
        updates,
    )
    adamw = optax.adamw(rate, weight_decay=h["weight_decay"])
    updates, inner = adamw.update(updates, state.inner_state, params)
    new = DefaultOptimizerState(
        optax.safe_increment(state.count),
        {**h, "learning_rate": rate},
        state.schedule,
        inner,
    )
    return updates, new


def default_optimizer(
    learning_rate: float = 3e-3,
    *,
    steps: int,
    warmup: int = 100,
    weight_decay: float = 0.05,
    clip: float = 1.0,
    final_fraction: float = 0.01,
) -> optax.GradientTransformation:
    """AdamW with a linear warm-up to `learning_rate` over `warmup` steps, then cosine decay to
    `final_fraction · learning_rate` at `steps`, after clipping the global gradient norm to
    `clip`. Every number is part of the state (`DefaultOptimizerState`), so one compiled step
    serves every setting; the current rate is `state.hyperparams["learning_rate"]`, which the
    trainer logs. The arguments are recorded as data on the transformation's `init` function
    (`optimizer.init.arguments`), for a training run's fingerprint."""
    for name, value in (("learning_rate", learning_rate), ("clip", clip)):
        if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
            raise ValueError(f"{name}={value!r} must be a finite number > 0.")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be a positive integer.")
    warmup = min(int(warmup), max(steps - 1, 0))
    alpha = float(learning_rate * final_fraction) / float(learning_rate)
    numbers = {
        "peak": float(learning_rate),
        "decay_steps": float(max(steps, warmup + 1) - warmup),
        "alpha": alpha,
        "one_minus_alpha": 1 - alpha,
    }

    def init(params):
        dtype = optax.tree.dtype(params, "highest")
        schedule = {"warmup": jnp.asarray(warmup, jnp.int32)}
        schedule |= {k: jnp.asarray(v) for k, v in numbers.items()}  # the default float dtype
        hyperparams = {
            "learning_rate": _rate(jnp.zeros([], jnp.int32), schedule).astype(dtype),
            "weight_decay": jnp.asarray(weight_decay, dtype),
            "clip": jnp.asarray(clip, dtype),
        }
        inner = optax.adamw(0.0, weight_decay=weight_decay).init(params)
        return DefaultOptimizerState(jnp.zeros([], jnp.int32), hyperparams, schedule, inner)

    # An optax transformation is a pair of functions that cannot be compared; the arguments
    # that made this one can: recorded on its `init` (one function per optimizer; `_update` is
    # shared), they join a training run's fingerprint.
    init.arguments = {
        "default_optimizer": {
            "learning_rate": float(learning_rate),
            "steps": int(steps),
            "warmup": int(warmup),
            "weight_decay": float(weight_decay),
            "clip": float(clip),
            "final_fraction": float(final_fraction),
        }
    }
    return optax.GradientTransformation(init, _update)
