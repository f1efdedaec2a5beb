"""Does a real trained Transformer cluster its tokens with depth, as the particle model predicts
(paper B's Fig. 1), does it keep clustering when its equation is solved past its trained depth,
and how far is it from its own continuous limit?

Model: all-MiniLM-L6-v2 (`wb.pretrained.minilm()`, the `pretrained` extra), the post-norm BERT
equation with its trained weights, in float64. Inputs: a few paragraphs written for this study,
each one sequence (no padding).

1. **Fig. 1**: at every layer `l = 0..6` the token states `x_i / ‖x_i‖` of each paragraph, the
   histogram of their pairwise inner products (i ≠ j, all paragraphs pooled), the mean inner
   product, the fraction of pairs above `1 − delta`, and the number of clusters (single linkage
   at `1 − delta`).
2. **Past the trained depth**: the equation with the last layer's controls held on `[6, T']`
   (`wb.control.extend_depth`), the same statistics every `every` layers up to `max_layers`.
3. **Re-discretization**: Lie–Trotter with `k ∈ steps` steps per layer (the network is `k = 1`):
   the max-abs distance of the final token states to the network and to `reference_steps` per
   layer, the observed order of the latter (`fit_order`; post-norm, so 1 at best), and the
   cosine similarities of a small paraphrase set's sentence embeddings at every `k`.
4. **Spectra and Lyapunov exponents per layer** (first paragraph, along the network's
   trajectory): the `num_eigenvalues` largest-modulus eigenvalues of the Jacobian of the
   layer's vector field at the layer's input (Arnoldi), the largest real part, the largest step
   Lie–Trotter's linear stability allows for the decaying ones (against the network's step 1),
   and the `num_exponents` finite-time Lyapunov exponents of the layer map `u ↦ Φ(l, u, 1)`
   (QR method, one layer).

The verdict on "mass moves toward 1 with depth" is computed from the mean inner products: the
last trained layer against the first, and the end of the extension against the last layer.

Figures: `histograms` (the inner-product densities per layer, Fig. 1's view), `depth` (mean inner
product and clustered fraction against depth, trained and extended), `rediscretization`
(distances against steps per layer).
"""

from __future__ import annotations

import dataclasses
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb
import workbench.analysis as wba
import workbench.control as wbc
from studies._toolkit.config import check, check_positive

NAME = "real-model-dynamics"
SUMMARY = (
    "Paper B's Fig. 1 on all-MiniLM-L6-v2: clustering per layer, past its depth, re-discretized."
)

PARAGRAPHS = (
    "The river rose slowly through the night. By morning the lower fields were under water, and "
    "the farmers moved their animals to the hill behind the church. Nobody in the village could "
    "remember a flood like it, although the old miller said his father had spoken of one, long "
    "before the bridge was built.",
    "A numerical method replaces a differential equation by a sequence of algebraic steps. Its "
    "order tells how fast the error falls as the step shrinks, and its stability region tells "
    "which steps keep the computed solution bounded. Both matter: an accurate method that is "
    "unstable for the step one can afford is of no use.",
    "She opened the letter at the kitchen table, read it twice, and then laughed out loud. The "
    "job was hers. She would leave in March, rent a small flat near the harbour, and learn to "
    "sail on weekends, as she had promised herself ten years ago.",
)
PARAPHRASES = (
    ("The cat is sleeping on the sofa.", "A cat naps on the couch."),
    ("The meeting was moved to Friday.", "They postponed the meeting until Friday."),
    ("He bought a new car last week.", "Last week he purchased a new automobile."),
    ("It is going to rain tomorrow.", "Tomorrow will be rainy."),
)


@dataclasses.dataclass(frozen=True)
class Config:
    max_layers: int = 24
    """Solve the equation up to this time (the model has 6 layers)."""
    every: int = 3
    """Statistics every this many layers past the trained depth."""
    steps: tuple[int, ...] = (1, 2, 4, 8)
    """Steps per layer of the re-discretization (1 is the network)."""
    reference_steps: int = 32
    """Lie–Trotter steps per layer of the reference solve; more than the largest of `steps`."""
    bins: int = 40
    """Equal bins of the inner-product histograms on [−1, 1]."""
    delta: float = 0.1
    """Pairs with inner product ≥ 1 − delta count as clustered."""
    min_increase: float = 0.05
    """Increase of the mean inner product that counts as moving toward 1."""
    num_eigenvalues: int = 6
    """Largest-modulus Jacobian eigenvalues computed per layer (Arnoldi)."""
    krylov_dim: int = 30
    """Krylov subspace dimension of the Arnoldi iteration; at least `num_eigenvalues`."""
    num_exponents: int = 4
    """Finite-time Lyapunov exponents computed per layer map."""

    def __post_init__(self):
        check_positive(
            self,
            "every",
            "reference_steps",
            "bins",
            "delta",
            "min_increase",
            "num_eigenvalues",
            "krylov_dim",
            "num_exponents",
        )
        check(
            self, "krylov_dim", self.krylov_dim >= self.num_eigenvalues, "at least num_eigenvalues"
        )
        check(
            self,
            "max_layers",
            isinstance(self.max_layers, int) and self.max_layers > 6,
            "an integer > 6 (the model's depth)",
        )
        check(
            self,
            "steps",
            len(self.steps) >= 2
            and self.steps[0] == 1
            and list(self.steps) == sorted(set(self.steps))
            and all(isinstance(k, int) for k in self.steps)
            and self.steps[-1] < self.reference_steps,
            "increasing integers starting at 1, all below reference_steps",
        )
        check(self, "delta", self.delta <= 1, "a number in (0, 1]")

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory`): all-MiniLM-L6-v2 (6 layers of width
        384, feed-forward 1536, 12 heads, 30 522 + 512 + 2 embedding rows) read in float32 and
        held in float64, its equation extended to `max_layers` layers (the controls of every
        layer copied, float64), and per paragraph (at most 96 tokens) the states at every layer
        boundary, the Arnoldi basis (`krylov_dim + 1` states), the Lyapunov frame
        (`num_exponents` tangents through one evaluation) and one evaluation's activations."""
        from studies._toolkit import memory as M

        d, hidden, heads, layers, tokens = 384, 1536, 12, 6, 96
        params = M.encoder_parameters(d, hidden, layers, vocab=30522 + 512 + 2)
        extended = M.encoder_parameters(d, hidden, self.max_layers)
        loaded = M.array_bytes(params, itemsize=M.F32) + M.array_bytes(params + extended)
        evaluation = M.attention_layer_floats(tokens, d, hidden, heads)
        states = len(PARAGRAPHS) * (self.max_layers + 1) + self.krylov_dim + 1
        work = M.array_bytes(states, tokens, d) + M.array_bytes(self.num_exponents + 2, evaluation)
        return loaded + work


def smoke_config() -> Config:
    return Config(
        max_layers=12, every=3, steps=(1, 2, 4), reference_steps=8, krylov_dim=12, num_exponents=2
    )


@dataclasses.dataclass
class Results:
    config: Config
    layers: np.ndarray
    """Depths of the statistics: 0..6 (trained), then 6 + every, … (extended)."""
    trained: np.ndarray
    """(depth,) bool: within the trained depth."""
    mean_inner_product: np.ndarray
    fraction_clustered: np.ndarray
    num_clusters: np.ndarray
    """(depth, paragraph): clusters at 1 − delta."""
    histograms: np.ndarray
    """(trained layer, bins): density of the pairwise inner products on [−1, 1]."""
    num_tokens: np.ndarray
    steps: np.ndarray
    distance_to_network: np.ndarray
    """(k,): max-abs distance of the final token states to k = 1."""
    distance_to_reference: np.ndarray
    """(k,): max-abs distance to `reference_steps` per layer."""
    observed_order: float | None
    paraphrase_cosines: np.ndarray
    """(k, pair): cosine of each paraphrase pair's sentence embeddings."""
    unrelated_cosines: np.ndarray
    """(k,): mean cosine between sentences of different pairs."""
    eigenvalues_real: np.ndarray
    """(layer, num_eigenvalues): real parts of the largest-modulus Jacobian eigenvalues."""
    eigenvalues_imag: np.ndarray
    max_real_eigenvalue: np.ndarray
    """(layer,)."""
    largest_stable_step: np.ndarray
    """(layer,): Lie–Trotter's linear stability limit for the decaying eigenvalues (inf: none)."""
    lyapunov: np.ndarray
    """(layer, num_exponents): finite-time Lyapunov exponents of each layer map."""
    wall_time_s: float


def _unit(states: np.ndarray) -> np.ndarray:
    return states / np.linalg.norm(states, axis=-1, keepdims=True)


@eqx.filter_jit
def _embed(embeddings, ids, types):
    """The initial token states `(B, n, d)` of a padded batch of sequences (one program)."""
    return jax.vmap(embeddings)(ids, types)


@eqx.filter_jit
def _layer_states(transformer, u0, mask):
    """States at every layer boundary 0..L (`(B, L + 1, n, d)`) of a padded batch, one step per
    layer (one program for the batch)."""

    def one(u, m):
        sol = transformer.solve(u, mask=m, save_steps=True)
        return jnp.concatenate([u[None], sol.us])

    return jax.vmap(one)(u0, mask)


@eqx.filter_jit
def _finals(transformer, u0, mask, num_steps):
    """`transformer(u, mask=m)` of every sequence of a padded batch, solved by the network's
    scheme with `num_steps` uniform steps: a traced step count, so one program serves every
    steps-per-layer of the re-discretization."""
    solve = lambda u, m: (
        wb.integrate(transformer.equation, u, transformer.scheme, num_steps=num_steps, mask=m).y
    )
    return jax.vmap(solve)(u0, mask)


@jax.jit
def _depth_statistics(states, delta):
    """Pairwise inner products `(depth, pairs)` and cluster counts `(depth,)` of one
    sequence's unit token states `(depth, n, d)` (one program per sequence length)."""
    pairs = jax.vmap(wb.particles.pair_inner_products)(states)
    clusters = jax.vmap(lambda x: wb.particles.cluster_count(x, threshold=delta))(states)
    return pairs, clusters


def _layer_map(equation, scheme, layer, u):
    """The network's layer `layer` (an integer array, traced: one compilation for every layer):
    one Lie–Trotter step of length 1 from `t = layer`."""
    return wb.step(equation, scheme, layer.astype(u.dtype), u, 1.0, piece=layer)


def compute(config: Config) -> Results:
    start = time.perf_counter()
    c = config
    with jax.enable_x64(True):
        enc = wb.pretrained.minilm(dtype=np.float64)
        bert = enc.model
        L = bert.transformer.num_layers
        extended = wbc.extend_depth(bert.transformer, c.max_layers)
        # The paragraphs as one padded batch (padding keys are masked out of attention, so
        # every real token's trajectory is that of its paragraph solved alone).
        ids, types, mask = enc.tokenize(list(PARAGRAPHS))
        lengths = mask.sum(axis=1)
        u0s = _embed(bert.embeddings, ids, types)
        mask = mask.astype(bool)
        raw_states = np.asarray(_layer_states(extended, u0s, mask))  # (paragraph, depth, n, d)
        per_text = [_unit(raw_states[p, :, :n]) for p, n in enumerate(lengths.tolist())]
        depths = list(range(L + 1)) + list(range(L + c.every, c.max_layers + 1, c.every))
        stats = [_depth_statistics(x[np.asarray(depths)], c.delta) for x in per_text]
        pairs_at = [np.asarray(pairs) for pairs, _ in stats]
        clusters_at = [np.asarray(counts) for _, counts in stats]
        mean_ip, frac, clusters = [], [], []
        hist = []
        for i, t in enumerate(depths):
            pairs = np.concatenate([p[i] for p in pairs_at])
            mean_ip.append(float(np.mean(pairs)))
            frac.append(float(np.mean(pairs >= 1 - c.delta)))
            clusters.append([int(counts[i]) for counts in clusters_at])
            if t <= L:
                counts, _ = np.histogram(np.clip(pairs, -1, 1), bins=c.bins, range=(-1, 1))
                hist.append(counts / (counts.sum() * (2 / c.bins)))
        # Re-discretization: final states and paraphrase embeddings at every k (one program
        # for all k: the step count is traced).
        finals = {}
        flat = [s for pair in PARAPHRASES for s in pair]
        p_ids, p_types, p_mask = enc.tokenize(flat)
        p_u0 = _embed(bert.embeddings, p_ids, p_types)
        p_keys = p_mask.astype(bool)
        cosines, unrelated = [], []
        tr = bert.transformer
        for k in [*c.steps, c.reference_steps]:
            num_steps = np.asarray(k * L)  # an array: traced, not static
            out = np.asarray(_finals(tr, u0s, mask, num_steps))
            finals[k] = [out[p, :n] for p, n in enumerate(lengths.tolist())]
            if k == c.reference_steps:
                break
            states = np.asarray(_finals(tr, p_u0, p_keys, num_steps))
            w = p_mask[..., None].astype(states.dtype)
            emb = _unit(np.sum(states * w, 1) / np.sum(w, 1))
            sims = emb @ emb.T
            cosines.append([sims[2 * i, 2 * i + 1] for i in range(len(PARAPHRASES))])
            off = [
                sims[a, b] for a in range(len(flat)) for b in range(len(flat)) if a // 2 != b // 2
            ]
            unrelated.append(float(np.mean(off)))

        def distance(a, b):
            return max(float(np.max(np.abs(x - y))) for x, y in zip(finals[a], finals[b]))

        # Spectra and Lyapunov exponents per layer along the first paragraph's trajectory.
        # (the extension holds the last layer's controls after L: its states 0..L are the
        # network's)
        states = raw_states[0, : L + 1, : int(lengths[0])]
        eq, lie = bert.transformer.equation, wb.schemes.LieTrotter()
        eigs, lyap = [], []
        for layer in range(L):
            field = wba.term_fields(eq, layer + 0.5)["full"]
            eigs.append(
                wba.arnoldi_eigenvalues(
                    field, states[layer], num_eigenvalues=c.num_eigenvalues, krylov_dim=c.krylov_dim
                )
            )
            layer_map = jax.tree_util.Partial(_layer_map, eq, lie, jnp.asarray(layer))
            exps, _ = wba.lyapunov_exponents(
                [layer_map], states[layer], num_exponents=c.num_exponents
            )
            lyap.append(exps)
        eigs = np.asarray(eigs)
        stable = []
        for e in eigs:
            decaying = e[e.real < -1e-9 * max(1.0, float(np.max(np.abs(e))))]
            stable.append(float(wba.max_stable_step(lie, decaying)))

        to_net = np.asarray([distance(k, 1) for k in c.steps])
        to_ref = np.asarray([distance(k, c.reference_steps) for k in c.steps])
        fit = wba.fit_order(1.0 / np.asarray(c.steps, float), to_ref, expected=1, throw=False)
        order = float(fit.order) if fit.success else None
    trained = np.asarray([t <= L for t in depths])
    return Results(
        config=c,
        layers=np.asarray(depths),
        trained=trained,
        mean_inner_product=np.asarray(mean_ip),
        fraction_clustered=np.asarray(frac),
        num_clusters=np.asarray(clusters),
        histograms=np.asarray(hist),
        num_tokens=np.asarray([x.shape[1] for x in per_text]),
        steps=np.asarray(c.steps),
        distance_to_network=to_net,
        distance_to_reference=to_ref,
        observed_order=order,
        paraphrase_cosines=np.asarray(cosines),
        unrelated_cosines=np.asarray(unrelated),
        eigenvalues_real=eigs.real,
        eigenvalues_imag=eigs.imag,
        max_real_eigenvalue=np.max(eigs.real, axis=1),
        largest_stable_step=np.asarray(stable),
        lyapunov=np.asarray(lyap),
        wall_time_s=time.perf_counter() - start,
    )


def _answers(r: Results) -> tuple[bool, bool]:
    L = int(np.sum(r.trained)) - 1
    m = r.mean_inner_product
    return bool(m[L] - m[0] >= r.config.min_increase), bool(m[-1] - m[L] >= r.config.min_increase)


def verdict(results: Results) -> str:
    r = results
    L = int(np.sum(r.trained)) - 1
    m = r.mean_inner_product
    within, beyond = _answers(r)
    answer = "Yes" if within and beyond else ("Partly" if within or beyond else "No")
    return (
        f"{answer}. The mean pairwise inner product of the normalized token states goes from "
        f"{m[0]:.3f} at the embedding to {m[L]:.3f} after layer {L} "
        f"({'up' if within else 'not up'} by {r.config.min_increase:g} or more), and to "
        f"{m[-1]:.3f} at t = {r.layers[-1]} with the last layer held "
        f"({'still rising' if beyond else 'no further rise of that size'}); pairs above "
        f"1 − {r.config.delta:g}: {100 * r.fraction_clustered[0]:.1f} % → "
        f"{100 * r.fraction_clustered[L]:.1f} % → {100 * r.fraction_clustered[-1]:.1f} %."
    )


def _convergence_sentence(r: Results) -> str:
    """What the re-discretization ladder shows, from its numbers: an observed order only when the
    distances to the reference fall (fitted slope ≥ 0.5), else the measured absence of one."""
    d = r.distance_to_reference
    where = f"the distance to the reference goes {' → '.join(f'{x:.2g}' for x in d)}"
    if r.observed_order is None:
        return f"no order could be fitted ({where})."
    if r.observed_order >= 0.5:
        return f"observed order {r.observed_order:.2f} (post-norm: 1 at best; {where})."
    return (
        f"no convergence over k = {r.steps[0]}..{r.steps[-1]}: {where} (fitted slope against "
        f"1/k {r.observed_order:.2f}, where convergence would show about 1), so there is no "
        "observed order: the trained network is far from its continuous limit, and the finer "
        "flows are not yet close to each other."
    )


def report(results: Results) -> str:
    from studies._toolkit.report import markdown_table

    r, c = results, results.config
    rows = [
        (
            f"{t}" + ("" if tr else " (extended)"),
            f"{m:.3f}",
            f"{100 * f:.1f} %",
            ", ".join(str(x) for x in k),
        )
        for t, tr, m, f, k in zip(
            r.layers, r.trained, r.mean_inner_product, r.fraction_clustered, r.num_clusters
        )
    ]
    rd = [
        (str(k), f"{a:.3e}", f"{b:.3e}", ", ".join(f"{x:.4f}" for x in p), f"{u:.4f}")
        for k, a, b, p, u in zip(
            r.steps,
            r.distance_to_network,
            r.distance_to_reference,
            r.paraphrase_cosines,
            r.unrelated_cosines,
        )
    ]
    return "\n".join(
        [
            f"all-MiniLM-L6-v2 in float64, {len(r.num_tokens)} paragraphs of "
            f"{', '.join(str(n) for n in r.num_tokens)} tokens; statistics of the normalized "
            f"token states, pairs within each paragraph pooled.",
            "",
            markdown_table(
                [
                    "depth t",
                    "mean inner product",
                    f"pairs ≥ 1 − {c.delta:g}",
                    f"clusters at 1 − {c.delta:g} (per paragraph)",
                ],
                rows,
            ),
            "",
            f"Re-discretization (Lie–Trotter, k steps per layer; k = 1 is the network; reference "
            f"{c.reference_steps} steps per layer): {_convergence_sentence(r)}",
            "",
            markdown_table(
                [
                    "k",
                    "distance to the network",
                    "distance to the reference",
                    "paraphrase cosines",
                    "mean cosine, unrelated",
                ],
                rd,
            ),
            "",
            "Jacobian spectra (largest-modulus eigenvalues of the field at each layer's input, "
            "first paragraph) and finite-time Lyapunov exponents of each layer map:",
            "",
            markdown_table(
                [
                    "layer",
                    "largest |λ|",
                    "largest Re λ",
                    "Lie stability limit (step 1)",
                    "Lyapunov exponents",
                ],
                [
                    (
                        str(i),
                        f"{np.max(e):.3g}",
                        f"{m:.3g}",
                        f"{s:.3g}",
                        ", ".join(f"{x:.3f}" for x in y),
                    )
                    for i, (e, m, s, y) in enumerate(
                        zip(
                            np.hypot(r.eigenvalues_real, r.eigenvalues_imag),
                            r.max_real_eigenvalue,
                            r.largest_stable_step,
                            r.lyapunov,
                        )
                    )
                ],
            ),
            "",
            f"Wall time {r.wall_time_s:.0f} s.",
        ]
    )


def figures(results: Results) -> dict:
    from studies._toolkit.report import new_figure

    r, c = results, results.config
    centers = np.linspace(-1, 1, c.bins + 1)
    centers = 0.5 * (centers[1:] + centers[:-1])
    fig, ax = new_figure(figsize=(6.5, 4.2))
    for layer, density in enumerate(r.histograms):
        ax.plot(centers, density, color=f"C{layer}", label=f"layer {layer}")
    ax.set(
        xlabel="⟨x_i, x_j⟩ (normalized token states, i ≠ j)",
        ylabel="density",
        title=f"all-MiniLM-L6-v2: pairwise inner products, {len(r.num_tokens)} paragraphs",
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig2, ax2 = new_figure(figsize=(6.5, 4.2))
    ax2.plot(r.layers, r.mean_inner_product, "o-", label="mean inner product")
    ax2.plot(r.layers, r.fraction_clustered, "s-", label=f"pairs ≥ 1 − {c.delta:g}")
    ax2.axvline(int(np.sum(r.trained)) - 1, color="gray", ls="--", lw=1, label="trained depth")
    ax2.set(
        xlabel="depth t (layers)",
        ylabel="statistic",
        title="clustering with depth (last layer held past t = 6)",
    )
    ax2.grid(True, alpha=0.3)
    ax2.legend()
    fig3, ax3 = new_figure(figsize=(6.5, 4.2))
    ax3.loglog(r.steps[1:], r.distance_to_network[1:], "o-", label="to the network (k = 1)")
    ax3.loglog(
        r.steps, r.distance_to_reference, "s-", label=f"to {c.reference_steps} steps per layer"
    )
    ax3.set(
        xlabel="steps per layer k",
        ylabel="max-abs distance of the final states",
        title="re-discretizing all-MiniLM-L6-v2",
    )
    ax3.grid(True, which="both", alpha=0.3)
    ax3.legend()
    return {"histograms": fig, "depth": fig2, "rediscretization": fig3, "spectra": _plot_spectra(r)}


def _plot_spectra(r: Results):
    """Each layer's Jacobian eigenvalues `τλ` (τ = 1, one Lie–Trotter step per layer) against
    the scheme's stability region `|R(z)| ≤ 1`, and the finite-time Lyapunov exponents."""
    import workbench as wb
    from studies._toolkit.report import new_figure

    fig, (ax, ax2) = new_figure(1, 2, figsize=(12, 4.6))
    re, im = r.eigenvalues_real, r.eigenvalues_imag
    span = 1.15 * max(2.0, float(np.max(np.abs(re))), float(np.max(np.abs(im))))
    x, y = np.meshgrid(np.linspace(-span, span, 400), np.linspace(-span, span, 400))
    R = wb.analysis.stability_function(wb.schemes.LieTrotter())
    ax.contourf(x, y, np.abs(R(x + 1j * y)), [0.0, 1.0], colors=["0.88"])
    ax.contour(x, y, np.abs(R(x + 1j * y)), [1.0], colors="0.4", linewidths=1)
    for layer in range(re.shape[0]):
        ax.scatter(re[layer], im[layer], s=14, color=f"C{layer}", label=f"layer {layer + 1}")
    ax.plot([], [], color="0.4", label="|R(z)| = 1 (Lie–Trotter)")
    ax.axhline(0, color="0.7", lw=0.5)
    ax.axvline(0, color="0.7", lw=0.5)
    ax.set(
        xlabel="Re τλ",
        ylabel="Im τλ",
        aspect="equal",
        title="largest-modulus Jacobian eigenvalues, τ = 1 (shaded: stable)",
    )
    ax.legend(fontsize=7, loc="upper left")
    layers = np.arange(1, r.lyapunov.shape[0] + 1)
    for j in range(r.lyapunov.shape[1]):
        ax2.plot(layers, r.lyapunov[:, j], "o-", color=f"C{j}", lw=1, label=f"exponent {j + 1}")
    ax2.axhline(0, color="0.6", lw=0.8)
    ax2.set(
        xlabel="layer",
        ylabel="finite-time Lyapunov exponent",
        title="finite-time Lyapunov exponents of each layer map",
    )
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=7)
    return fig
