"""The train-sequence study: its verdict follows the numbers, its config refuses impossible
tasks, and a run killed with SIGKILL resumes through the command line to the same parameters."""

import dataclasses
import pathlib

import numpy as np
import pytest

import studies.training.train_sequence as s
from studies import ConfigError

from helpers import certificate_dict, kill_and_resume, study_cli

REPO = pathlib.Path(__file__).resolve().parents[3]


def test_train_sequence_verdict_follows_the_accuracy():
    c = s.smoke_config()
    r = s.Results(
        config=c,
        test_accuracy=0.9,
        final_params_sha256="0" * 64,
        baseline_accuracy=0.22,
        num_steps=200,
        resumed_from=0,
        steps_per_second=80.0,
        compile_time_s=8.0,
        wall_time_s=30.0,
        num_devices=1,
        history_steps=np.arange(1),
        history_objective=np.ones(1),
        history_eval_steps=np.arange(1),
        history_eval_accuracy=np.ones(1),
        certificate=None,
    )
    assert s.verdict(r).startswith("No. Held-out token accuracy 90.00 % against the target 70.0 %")
    r = dataclasses.replace(r, certificate=certificate_dict(0.0))
    assert s.verdict(r).startswith("Yes. Held-out token accuracy 90.00 % against the target 70.0 %")
    leaning = dataclasses.replace(r, certificate=certificate_dict(0.001, order=0.5))
    assert s.verdict(leaning).startswith("No. Held-out token accuracy 90.00 %")
    assert "observed order 0.50 against the expected 1" in s.verdict(leaning)
    worse = dataclasses.replace(r, test_accuracy=0.5)
    assert s.verdict(worse).startswith("No. Held-out token accuracy 50.00 %")
    full = dataclasses.replace(r, config=s.Config(), test_accuracy=0.985)
    assert s.verdict(full).startswith(
        "No. Held-out token accuracy 98.50 % against the target 99.0 %"
    )


def test_train_sequence_config_refuses_impossible_tasks():
    with pytest.raises(ConfigError, match="num_train"):
        s.Config(length=2, vocab=4)  # 16 distinct sequences for 5120 examples
    with pytest.raises(ConfigError, match="batch_size"):
        s.Config(num_train=32)
    with pytest.raises(ConfigError, match="length"):
        s.Config(length=1)


def _cli(out, *extra, wait=True, jax_cache=None):
    return study_cli(
        "train-sequence",
        out,
        "--steps",
        "80",
        "--warmup",
        "10",
        "--checkpoint-every",
        "10",
        "--num-train",
        "512",
        "--num-test",
        "128",
        "--certificate-examples",
        "0",
        *extra,
        wait=wait,
        jax_cache=jax_cache,
    )


@pytest.mark.slow
def test_train_sequence_resumes_after_sigkill_with_the_same_hash(tmp_path):
    want, got, steps = kill_and_resume(_cli, tmp_path)
    assert 0 < got["resumed_from"] < got["num_steps"] == want["num_steps"] == 80
    assert got["final_params_sha256"] == want["final_params_sha256"]
    assert got["test_accuracy"] == want["test_accuracy"]
    assert steps == list(range(10, 81, 10))
