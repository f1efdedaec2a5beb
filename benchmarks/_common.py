"""Shared pieces of the benchmark scripts: environment record, JSON output, timing statistics,
and the hand-written equinox encoders that the workbench is measured against.

The environment record and the atomic JSON writer are `workbench.io`'s (`environment`,
`atomic_write_json`); this module only adds what a benchmark needs on top (CPU model, torch
version, load average, XLA flags).

The baselines here are written from scratch, the way a competent JAX user would write a
post-LN `torch.nn.TransformerEncoder` in equinox: one `EncoderLayer` module, and either a
`lax.scan` over stacked layers (`ScanEncoder`) or a Python loop over a tuple of layers
(`LoopEncoder`, unrolled at trace time).
"""

import math
import os
import platform
import time
from collections.abc import Mapping
from importlib import metadata

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from workbench.io import atomic_write_json, environment as workbench_environment

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


# ----------------------------------------------------------------------------- environment / IO


def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def environment() -> dict:
    """`workbench.io.environment()` plus what benchmark numbers also depend on.

    Added to its dict: `processor` (CPU model), `os_cpu_count` (all CPUs, next to its
    `cpu_count`, the affinity mask), the torch version in `packages`, `XLA_FLAGS`, and the load
    average at the time of the call.
    """
    env = workbench_environment()
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    return {
        **env,
        "packages": {**env["packages"], "torch": torch_version},
        "processor": _cpu_model(),
        "os_cpu_count": os.cpu_count(),
        "XLA_FLAGS": os.environ.get("XLA_FLAGS"),
        # Other processes share these CPUs; a high load makes every number noisier.
        "loadavg_1_5_15_min": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def write_json(path: str, obj) -> None:
    """`workbench.io.atomic_write_json`, after creating the destination folder if needed."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_json(path, obj)


# ----------------------------------------------------------------------------- timing


def _cpu_ticks() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [float(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is in user)
    return (total - idle) / hz, total / hz


def _own_cpu_s() -> float:
    """CPU seconds of this process and of its children that have been waited for."""
    try:
        import resource
    except ImportError:  # not on this platform: this process alone
        return time.process_time()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


class OtherLoad:
    """CPU used by *other* processes while a block runs, as a fraction of all CPUs.

    Machine-wide busy time from /proc/stat minus the CPU time of this process and of the
    children it waited for (a benchmark's subprocesses are its own load). The benchmarks record
    it: on a shared machine a value well above 0 means the timings are contended.
    """

    def __enter__(self) -> "OtherLoad":
        self._start = (_cpu_ticks(), _own_cpu_s(), time.perf_counter())
        self.fraction = None
        return self

    def __exit__(self, *exc) -> None:
        ticks0, own0, wall0 = self._start
        ticks1 = _cpu_ticks()
        if ticks0 is None or ticks1 is None:
            return
        busy = ticks1[0] - ticks0[0]
        total = ticks1[1] - ticks0[1]
        own = _own_cpu_s() - own0
        if total > 0:
            self.fraction = max(0.0, min(1.0, (busy - own) / total))


def wait_for_quiet(max_wait_s: float, threshold: float = 0.1, probe_s: float = 2.0) -> dict:
    """Sleep until other processes use less than `threshold` of the CPUs over a `probe_s`
    window, for at most `max_wait_s`. Returns what was seen (recorded in the results)."""
    t0 = time.perf_counter()
    seen = None
    while True:
        with OtherLoad() as probe:
            time.sleep(probe_s)
        seen = probe.fraction
        waited = time.perf_counter() - t0
        if seen is None or seen < threshold or waited >= max_wait_s:
            return {
                "waited_s": round(waited, 1),
                "other_load_at_start": seen,
                "quiet": seen is not None and seen < threshold,
                "threshold": threshold,
            }
        print(f"  waiting for a quiet machine: other processes use {seen:.0%} of the CPUs")


def matmul_peaks(size: int = 2048, repeats: int = 5) -> dict[str, float]:
    """Best-of-`repeats` GFLOP/s of a jitted `jnp.dot` of two `size × size` matrices on the
    default device, `{"float32": ..., "float64": ...}`: the peaks a kernel's throughput is a
    fraction of (2048 fills a CPU; an accelerator needs about 8192)."""
    peaks = {}
    for name, dtype in (("float32", jnp.float32), ("float64", jnp.float64)):
        with jax.enable_x64(dtype == jnp.float64):
            a = jax.random.normal(jax.random.key(0), (size, size), dtype)
            dot = jax.jit(jnp.dot)
            dot(a, a).block_until_ready()
            best = float("inf")
            for _ in range(repeats):
                t = time.perf_counter()
                dot(a, a).block_until_ready()
                best = min(best, time.perf_counter() - t)
        peaks[name] = 2 * size**3 / best / 1e9
    return peaks


def stats(samples) -> dict:
    """Median, inter-quartile range, min and max of a list of seconds."""
    a = np.asarray(samples, float)
    q25, q50, q75 = np.percentile(a, [25, 50, 75])
    return {
        "median_s": float(q50),
        "iqr_s": float(q75 - q25),
        "q25_s": float(q25),
        "q75_s": float(q75),
        "min_s": float(a.min()),
        "max_s": float(a.max()),
        "n": int(a.size),
    }


def table(rows: list[list], header: list[str]) -> str:
    cells = [header] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True))
    return "\n".join(
        [line(cells[0]), line(["-" * w for w in widths])] + [line(r) for r in cells[1:]]
    )


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


# ----------------------------------------------------------------------------- baselines


def layer_norm(x, weight, bias, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * weight + bias


class EncoderLayer(eqx.Module):
    """One post-LN encoder layer, `x @ W` convention, fused QKV as torch stores it."""

    w_qkv: Float[Array, "d 3d"]
    b_qkv: Float[Array, " 3d"]
    w_out: Float[Array, "d d"]
    b_out: Float[Array, " d"]
    w_1: Float[Array, "d m"]
    b_1: Float[Array, " m"]
    w_2: Float[Array, "m d"]
    b_2: Float[Array, " d"]
    ln1_weight: Float[Array, " d"]
    ln1_bias: Float[Array, " d"]
    ln2_weight: Float[Array, " d"]
    ln2_bias: Float[Array, " d"]
    num_heads: int = eqx.field(static=True)
    eps: float = eqx.field(static=True)

    def attention(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        n, d = x.shape
        h = self.num_heads
        # Head-major (3, h, n, c) before the einsums: on XLA:CPU this is about 15 % faster for
        # the whole encoder than contracting in the (n, h, c) layout ("ihc,jhc->hij"), so the
        # baseline uses it rather than flatter the workbench.
        qkv = (x @ self.w_qkv + self.b_qkv).reshape(n, 3, h, d // h).transpose(1, 2, 0, 3)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = jnp.einsum("hic,hjc->hij", q, k) / math.sqrt(d // h)
        weights = jax.nn.softmax(scores, axis=-1)
        z = jnp.einsum("hij,hjc->hic", weights, v).transpose(1, 0, 2).reshape(n, d)
        return z @ self.w_out + self.b_out

    def feedforward(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        return jax.nn.relu(x @ self.w_1 + self.b_1) @ self.w_2 + self.b_2

    def __call__(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        x = layer_norm(x + self.attention(x), self.ln1_weight, self.ln1_bias, self.eps)
        return layer_norm(x + self.feedforward(x), self.ln2_weight, self.ln2_bias, self.eps)


_TRANSPOSED = {  # torch `Linear` stores (out, in); the layer uses `x @ W` with W (in, out).
    "w_qkv": "self_attn.in_proj_weight",
    "w_out": "self_attn.out_proj.weight",
    "w_1": "linear1.weight",
    "w_2": "linear2.weight",
}
_PLAIN = {
    "b_qkv": "self_attn.in_proj_bias",
    "b_out": "self_attn.out_proj.bias",
    "b_1": "linear1.bias",
    "b_2": "linear2.bias",
    "ln1_weight": "norm1.weight",
    "ln1_bias": "norm1.bias",
    "ln2_weight": "norm2.weight",
    "ln2_bias": "norm2.bias",
}


def _layer_arrays(sd: Mapping, i: int) -> dict[str, np.ndarray]:
    """Layer `i`'s weights as numpy arrays in the `EncoderLayer` field layout."""
    g = lambda k: np.asarray(sd[f"layers.{i}.{k}"])
    return {**{f: g(k).T for f, k in _TRANSPOSED.items()}, **{f: g(k) for f, k in _PLAIN.items()}}


def _num_layers(sd: Mapping) -> int:
    return 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("layers."))


class ScanEncoder(eqx.Module):
    """Post-LN encoder: one `EncoderLayer` whose arrays carry a leading layer axis, `lax.scan`."""

    layers: EncoderLayer

    @classmethod
    def from_torch(cls, sd: Mapping, *, num_heads: int, eps: float = 1e-5, dtype=jnp.float32):
        # Stack in numpy, then one host-to-device transfer per weight.
        per_layer = [_layer_arrays(sd, i) for i in range(_num_layers(sd))]
        stacked = {f: jnp.asarray(np.stack([p[f] for p in per_layer]), dtype) for f in per_layer[0]}
        return cls(EncoderLayer(**stacked, num_heads=num_heads, eps=eps))

    def __call__(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        params, static = eqx.partition(self.layers, eqx.is_array)

        def body(h, p):
            return eqx.combine(p, static)(h), None

        y, _ = jax.lax.scan(body, x, params)
        return y


class LoopEncoder(eqx.Module):
    """Post-LN encoder as a tuple of layers and a Python loop: unrolled when traced."""

    layers: tuple[EncoderLayer, ...]

    @classmethod
    def from_torch(cls, sd: Mapping, *, num_heads: int, eps: float = 1e-5, dtype=jnp.float32):
        layers = []
        for i in range(_num_layers(sd)):
            arrays = {f: jnp.asarray(x, dtype) for f, x in _layer_arrays(sd, i).items()}
            layers.append(EncoderLayer(**arrays, num_heads=num_heads, eps=eps))
        return cls(tuple(layers))

    def __call__(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        for layer in self.layers:
            x = layer(x)
        return x


def torch_encoder(sd: Mapping, *, num_heads: int, eps: float = 1e-5):
    """`torch.nn.TransformerEncoder` (post-LN, ReLU, batch_first, eval) holding `sd`."""
    import torch

    L = _num_layers(sd)
    d = np.asarray(sd["layers.0.self_attn.in_proj_weight"]).shape[1]
    m = np.asarray(sd["layers.0.linear1.weight"]).shape[0]
    layer = torch.nn.TransformerEncoderLayer(
        d,
        num_heads,
        dim_feedforward=m,
        dropout=0.0,
        activation="relu",
        layer_norm_eps=eps,
        batch_first=True,
        norm_first=False,
    )
    enc = torch.nn.TransformerEncoder(layer, num_layers=L, enable_nested_tensor=False)
    enc.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()})
    return enc.eval()
