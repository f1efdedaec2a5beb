r"""The certificate of a trained model: is the trained network still a good discretization of its
equation? Its held-out accuracy when the same controls are solved with more steps and with a
second scheme, its error against a refined solve, its observed order, its largest stable step,
whether a discretization plan's tolerance holds for the trained weights — and one verdict,
`consistent`, computed from stated thresholds.

A network trained at one Lie–Trotter step per layer can be an excellent classifier and a poor
discretization: its accuracy moves by points when its equation is solved more finely
(Queiruga et al. 2020). `consistent` is true when the accuracy at every refinement stays within
`max_accuracy_spread` of the model's own, the error ladder shows the expected order (no order
reduction beyond `order_tolerance`) and, with a plan, the plan's tolerance holds. An order above
the expected one by more than `order_tolerance` is flagged too (`order_raised`: the ladder is
not in its asymptotic regime, or the scheme's leading error term vanishes for these weights) but
does not make the model inconsistent: its error still falls at least as fast as the scheme's.

A plan (`workbench run plan`) is made for given weights; training moves them. The certificate
measures the same quantities on the trained controls, so a plan that no longer holds is caught.
Call it in float64 (`jax.enable_x64(True)` and a model cast to float64): orders and errors near
the round-off level of float32 mean nothing.
"""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import number_in_range, positive_float
from .._integrate import integrate
from ..analysis._convergence import error_ladder, reference_solution
from ..analysis._order import fit_order
from ..analysis._paired import paired_difference
from ..analysis._plan import DiscretizationPlan
from ..analysis._spectra import arnoldi_eigenvalues, layer_inputs, term_fields
from ..analysis._stability import max_stable_step
from ..schemes._splitting import LieTrotter, Strang

__all__ = ["Certificate", "RefinementAccuracy", "certify", "refinement_accuracy"]


@dataclasses.dataclass(frozen=True)
class RefinementAccuracy:
    """Held-out accuracy of one trained model under refinement (`refinement_accuracy`).

    - `scheme`, `steps_per_layer`, `accuracy`: the model's own discretization and accuracy.
    - `refined_steps_per_layer`, `refined_accuracies`: the same scheme at `factors ×` its steps.
    - `second_scheme`, `second_steps_per_layer`, `second_accuracy`: another scheme at the finest.
    - `spread`: the largest `|accuracy − own accuracy|` over all of these (a fraction).
    - `paired`: one dict per refinement and then the second scheme (`scheme`,
      `steps_per_layer`, and the fields of `workbench.analysis.PairedDifference` against the
      model's own discretization on the same held-out examples: the difference in points with
      its Newcombe interval `low`, `high` at `confidence`, the discordant counts and the exact
      McNemar `p_value`). Empty when no held-out example has a label.
    """

    scheme: str
    steps_per_layer: int
    accuracy: float
    refined_steps_per_layer: list
    refined_accuracies: list
    second_scheme: str
    second_steps_per_layer: int
    second_accuracy: float
    spread: float
    paired: list = dataclasses.field(default_factory=list)


def refinement_accuracy(
    model,
    data,
    *,
    factors=(2, 4, 8, 16),
    second_scheme=None,
    batch_size: int = 512,
    confidence: float = 0.95,
) -> RefinementAccuracy:
    r"""The accuracy of `model` (a `ControlledModel`) on `data` (a held-out `Dataset`) at its own
    discretization, at `factors ×` its steps per layer, and with `second_scheme` (default:
    Strang, or Lie–Trotter for a model solved by Strang) at the largest factor.

    The model is evaluated in its own dtype (as trained): this is the accuracy a user of the
    trained network sees, not a float64 error. The refined solves take their step count at run
    time (`integrate` with a traced `num_steps`), so every factor of one scheme shares one
    compiled program: the predictions are those of `model.rediscretize(scheme, f * k)`.

    Every discretization predicts the same held-out examples, so each one is also compared with
    the model's own *paired*, example by example (`workbench.analysis.paired_difference` at
    `confidence`): the `paired` entries say whether a change of accuracy is more than the noise
    of which examples happen to be held out.
    """
    from ._callbacks import _predict, held_out_accuracy
    from ._models import ControlledModel

    if not isinstance(model, ControlledModel):
        raise ValueError(
            f"refinement_accuracy takes a workbench.control.ControlledModel; got "
            f"{type(model).__name__}."
        )
    factors = sorted(set(int(f) for f in factors))
    if not factors or factors[0] < 2:
        raise ValueError(f"factors={factors!r} must be integers >= 2 (refinements of the model).")
    confidence = number_in_range(
        "confidence", confidence, 0.0, 1.0, owner="refinement_accuracy", hint="e.g. 0.95"
    )
    tr = model.transformer
    k = tr.steps_per_layer
    if second_scheme is None:
        second_scheme = LieTrotter() if isinstance(tr.scheme, Strang) else Strang()

    def acc(m, scheme=None, steps_per_layer=None):
        """The held-out accuracy and the per-example correctness (labelled examples, in order)
        of one discretization: the logits of `held_out_accuracy`'s batches are kept."""
        predict = _predict
        if scheme is not None:
            steps = jnp.asarray(steps_per_layer * tr.num_layers, jnp.int32)

            def predict(m, xs):
                return _logits_at(m, scheme, xs, steps)

        batches = []

        def recorded(m, xs):
            logits = predict(m, xs)
            batches.append(logits)
            return logits

        accuracy = float(held_out_accuracy(m, data, batch_size=batch_size, predict=recorded))
        return accuracy, _correctness(batches, data, batch_size)

    own, own_correct = acc(model)
    refined, correct = [], []
    for f in factors:
        a, c = acc(model, tr.scheme, f * k)
        refined.append(a)
        correct.append(c)
    finest = factors[-1] * k
    second, second_correct = acc(model, second_scheme, finest)
    spread = max(abs(a - own) for a in [*refined, second])
    labels = [(type(tr.scheme).__name__, f * k) for f in factors]
    labels.append((type(second_scheme).__name__, finest))
    paired = []
    if own_correct.size:
        for (name, steps_per_layer), c in zip(labels, [*correct, second_correct]):
            result = paired_difference(own_correct, c, confidence=confidence)
            paired.append(
                {"scheme": name, "steps_per_layer": steps_per_layer, **dataclasses.asdict(result)}
            )
    return RefinementAccuracy(
        scheme=type(tr.scheme).__name__,
        steps_per_layer=k,
        accuracy=own,
        refined_steps_per_layer=[f * k for f in factors],
        refined_accuracies=refined,
        second_scheme=type(second_scheme).__name__,
        second_steps_per_layer=finest,
        second_accuracy=second,
        spread=float(spread),
        paired=paired,
    )


def _correctness(batches, data, batch_size: int) -> np.ndarray:
    """Per-example correctness from the logits of `held_out_accuracy`'s batches (its
    `even_batches`, in order): `argmax == label` for the labelled examples (label `>= 0`)."""
    from ._data import even_batches

    hits = []
    for logits, (indices, length) in zip(batches, even_batches(len(data), batch_size)):
        ys = np.asarray(data.targets[indices[:length]])
        guess = np.asarray(jnp.argmax(logits[:length], -1))
        hits.append((guess == ys)[ys >= 0])
    return np.concatenate(hits) if hits else np.zeros(0, bool)


@eqx.filter_jit
def _logits_at(model, scheme, xs, num_steps):
    """Logits of `model` (a `ControlledModel`) on the batch `xs` with its equation solved by
    `scheme` in `num_steps` steps over the whole depth, a traced integer: one compiled program
    per scheme (and batch shape) for every step count."""
    equation = model.transformer.equation

    def one(x):
        return model.head(integrate(equation, model.embedding(x), scheme, num_steps=num_steps).y)

    return jax.vmap(one)(xs)


@dataclasses.dataclass(frozen=True)
class Certificate:
    """What `certify` measured (all errors are max-abs over the token states at `T`, worst
    example).

    - `scheme`, `steps_per_layer`: the trained model's discretization.
    - `error`: its error against the reference (a Dopri8 solve, `reference_steps` per layer),
      and `reference_error_estimate` (Richardson) that shows the reference resolves it.
    - `ladder_steps_per_layer`, `ladder_errors`: the scheme at refined step counts.
    - `observed_order` (with `order_ci`) from `fit_order` on the ladder, `None` when no window
      fits; `expected_order`: `Transformer.expected_order`.
    - `largest_stable_step`: the linear stability limit of the scheme for the decaying part of
      the Jacobian spectra (largest-modulus eigenvalues, Arnoldi) of the field at the start of
      every layer along the trajectory (`inf` when none of them decays: nothing to judge, see
      `num_decaying_eigenvalues`); `step` the trained step, `stable`: `step <=
      largest_stable_step`; `max_real_eigenvalue`: the largest real part found (> 0: growing
      modes of the exact flow).
    - `plan_*`: the plan's method, step count and tolerance, its error for the trained weights
      at those steps, and `plan_holds` (`None` without a plan).
    - `accuracy`: the `RefinementAccuracy` as a dict (`None` when not measured);
      `max_accuracy_spread`: its threshold.
    - `order_tolerance`; `order_reduced`: the observed order is below `expected_order −
      order_tolerance` (or none could be fitted); `order_raised`: it is above `expected_order +
      order_tolerance`; `order_as_expected`: neither (the observed order is the scheme's
      `± order_tolerance`).
    - `consistent`: `accuracy.spread <= max_accuracy_spread`, no order reduction, and the plan
      holds when one was given; `None` when the accuracies were not measured (nothing decided).
    - `reasons`: why `consistent` is false, one line each.
    """

    scheme: str
    steps_per_layer: int
    error: float
    reference_error_estimate: float
    ladder_steps_per_layer: list
    ladder_errors: list
    observed_order: float | None
    order_ci: tuple | None
    expected_order: int
    largest_stable_step: float
    step: float
    stable: bool
    num_decaying_eigenvalues: int
    max_real_eigenvalue: float
    plan_method: str | None = None
    plan_steps_per_layer: int | None = None
    plan_tolerance: float | None = None
    plan_error: float | None = None
    plan_holds: bool | None = None
    accuracy: dict | None = None
    max_accuracy_spread: float = 0.005
    order_tolerance: float = 0.3
    order_reduced: bool = False
    order_raised: bool = False
    consistent: bool | None = None
    reasons: list = dataclasses.field(default_factory=list)

    @property
    def order_as_expected(self) -> bool:
        return not (self.order_reduced or self.order_raised)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "order_as_expected": self.order_as_expected}


def certify(
    transformer,
    initial_states,
    *,
    plan: DiscretizationPlan | None = None,
    ladder=None,
    reference_steps: int = 64,
    num_eigenvalues: int = 6,
    krylov_dim: int = 30,
    accuracy: RefinementAccuracy | None = None,
    max_accuracy_spread: float = 0.005,
    order_tolerance: float = 0.3,
) -> Certificate:
    r"""Measure a trained `transformer` (a `workbench.architectures.Transformer`) on
    `initial_states` (a few `u(0)`, shape `(examples, n, d)`, e.g. embedded held-out inputs).

    **Arguments:**

    - `transformer`: the trained equation with its scheme and steps per layer.
    - `initial_states`: `(examples, n, d)` in the model's dtype (float64 advised).
    - `plan`: a `DiscretizationPlan` to check against the trained weights (its method must be
      one `error_ladder` runs: a splitting scheme or a diffrax solver).
    - `ladder`: steps per layer for the order fit (default: 1, 2, 4, 8, 16 × the model's).
    - `reference_steps`: Dopri8 steps per layer of the reference (default 64, at least 4 × the
      finest ladder entry).
    - `num_eigenvalues`, `krylov_dim`: the Arnoldi spectra (per layer, first example).
    - `accuracy`: the model's `refinement_accuracy` on held-out data, which `consistent` needs.
    - `max_accuracy_spread` (a fraction: 0.005 is half a point), `order_tolerance`: the
      thresholds of `consistent`.

    **Returns:** a `Certificate`.
    """
    order_tolerance = positive_float(
        "order_tolerance", order_tolerance, owner="certify", allow_zero=True, numpy_scalars=True
    )
    max_accuracy_spread = positive_float(
        "max_accuracy_spread",
        max_accuracy_spread,
        owner="certify",
        allow_zero=True,
        numpy_scalars=True,
    )
    equation, scheme = transformer.equation, transformer.scheme
    k = transformer.steps_per_layer
    states = np.asarray(initial_states)
    if states.ndim != 3:
        raise ValueError(f"initial_states must be (examples, n, d); got shape {states.shape}.")
    if ladder is None:
        ladder = [f * k for f in (1, 2, 4, 8, 16)]
    steps = sorted(set(int(s) for s in ladder) | {k})
    reference_steps = max(int(reference_steps), 4 * steps[-1])
    errors = np.zeros(len(steps))
    error_estimate = 0.0
    plan_error = 0.0 if plan is not None else None
    fit = None
    for u0 in states:
        u0 = jax.numpy.asarray(u0)
        ref = reference_solution(equation, u0, steps_per_layer=reference_steps)
        error_estimate = max(error_estimate, ref.error_estimate)
        lad = error_ladder(
            equation, u0, scheme, steps, ref, declared_order=scheme.order(), repeats=1
        )
        errors = np.maximum(errors, lad.errors)
        if plan is not None:
            check = error_ladder(
                equation,
                u0,
                plan.method_object(),
                [plan.steps_per_layer],
                ref,
                min_points=1,
                repeats=1,
            )
            plan_error = max(plan_error, float(check.errors[0]))
    h = equation.piece_length / np.asarray(steps, float)
    fit = fit_order(h, errors, expected=transformer.expected_order, throw=False)
    fit = fit if fit.success else None
    # Spectra at the start of every layer along the first example's trajectory (of every step
    # for controls without layers, e.g. a smooth basis, with the field at the step's midpoint).
    if equation.is_piecewise_constant:
        starts = layer_inputs(transformer, states[0])
        times = [(layer + 0.5) * equation.piece_length for layer in range(len(starts))]
    else:
        u_first = jax.numpy.asarray(states[0])
        us = transformer.solve(u_first, save_steps=True).us
        starts = [u_first] + list(us[:-1])
        tau = equation.t1 / len(us)
        times = [(i + 0.5) * tau for i in range(len(starts))]
    eigs = []
    for v, t in zip(starts, times):
        f = term_fields(equation, t)["full"]
        eigs.append(
            arnoldi_eigenvalues(f, v, num_eigenvalues=num_eigenvalues, krylov_dim=krylov_dim)
        )
    eigs = np.concatenate(eigs)
    decaying = eigs[eigs.real < -1e-9 * max(1.0, float(np.max(np.abs(eigs))))]
    tau_star = float(max_stable_step(scheme, decaying))
    step = equation.piece_length / k
    expected = int(transformer.expected_order)
    order_reduced = fit is None or float(fit.order) < expected - order_tolerance
    order_raised = fit is not None and float(fit.order) > expected + order_tolerance
    reasons = []
    if order_reduced:
        seen = "no order could be fitted" if fit is None else f"observed order {fit.order:.2f}"
        reasons.append(f"{seen} against the expected {expected} (tolerance {order_tolerance})")
    if plan is not None and plan_error > plan.tolerance:
        reasons.append(f"the plan's error {plan_error:.3g} exceeds its tolerance {plan.tolerance}")
    consistent = None
    if accuracy is not None:
        if accuracy.spread > max_accuracy_spread:
            reasons.append(
                f"held-out accuracy moves by {100 * accuracy.spread:.2f} points under refinement "
                f"(own {100 * accuracy.accuracy:.2f} %), more than {100 * max_accuracy_spread:.2f}"
            )
        consistent = not reasons
    return Certificate(
        scheme=type(scheme).__name__,
        steps_per_layer=k,
        error=float(errors[steps.index(k)]),
        reference_error_estimate=float(error_estimate),
        ladder_steps_per_layer=steps,
        ladder_errors=[float(e) for e in errors],
        observed_order=None if fit is None else float(fit.order),
        order_ci=None if fit is None else (float(fit.ci_low), float(fit.ci_high)),
        expected_order=expected,
        largest_stable_step=tau_star,
        step=float(step),
        stable=bool(step <= tau_star),
        num_decaying_eigenvalues=int(decaying.size),
        max_real_eigenvalue=float(np.max(eigs.real)),
        plan_method=None if plan is None else plan.method,
        plan_steps_per_layer=None if plan is None else plan.steps_per_layer,
        plan_tolerance=None if plan is None else plan.tolerance,
        plan_error=plan_error,
        plan_holds=None if plan is None else bool(plan_error <= plan.tolerance),
        accuracy=None if accuracy is None else dataclasses.asdict(accuracy),
        max_accuracy_spread=float(max_accuracy_spread),
        order_tolerance=float(order_tolerance),
        order_reduced=bool(order_reduced),
        order_raised=bool(order_raised),
        consistent=consistent,
        reasons=reasons,
    )
