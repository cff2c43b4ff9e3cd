"""Helpers every `rlvr-bench` subcommand shares: the bench model, FLOP counts, datasheet peaks,
timing and op profiles, machine info, JSON writing, tables and plots.

Every benchmark's config extends `ModelSize`, so that learner and decode figures describe one
model; FLOPs follow the model-FLOPs convention of PaLM and Megatron (`token_flops`).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr_jax.bench import progress

if TYPE_CHECKING:
    from rlvr_jax.models import ArchConfig

DATASHEETS: tuple[tuple[str, str, float, float], ...] = (
    ("h100 pcie", "NVIDIA H100 PCIe", 756.0, 2000.0),
    ("h100 nvl", "NVIDIA H100 NVL", 835.0, 3900.0),
    ("h100", "NVIDIA H100 SXM", 989.0, 3350.0),
    ("h200", "NVIDIA H200", 989.0, 4800.0),
    ("a100", "NVIDIA A100", 312.0, 2039.0),
    ("v5 lite", "TPU v5e", 197.0, 819.0),
    ("v5e", "TPU v5e", 197.0, 819.0),
    ("v5p", "TPU v5p", 459.0, 2765.0),
    ("tpu v5", "TPU v5p", 459.0, 2765.0),
    ("tpu v4", "TPU v4", 275.0, 1228.0),
)
"""(substring of the lower-cased `device_kind`, datasheet name, dense bf16 TFLOP/s per chip,
HBM GB/s per chip); the first match wins, so the more specific patterns come first."""


def datasheet(device_kind: str) -> dict[str, Any] | None:
    """`{"name", "bf16_tflops", "hbm_gbps"}` of a JAX `device_kind`; None when unknown (CPUs)."""
    kind = device_kind.lower()
    for pattern, name, tflops, gbps in DATASHEETS:
        if pattern in kind:
            return {"name": name, "bf16_tflops": tflops, "hbm_gbps": gbps}
    return None


def option(default: Any, flag: str | None = "", **argparse: Any) -> Any:
    """A config field whose flag is not the plain `--<field-name>` (`rlvr_jax.bench.table`)."""
    return dataclasses.field(default=default, metadata={"flag": flag, **argparse})


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """The bench model's sizes (`hf_config_dict`); the defaults make the 56M-parameter one."""

    d_model: int = 512
    """D: hidden size."""
    n_layers: int = option(8, "--layers")
    """L: decoder layers."""
    n_heads: int = option(8, "--heads")
    """N: query heads."""
    n_kv_heads: int = option(2, "--kv-heads")
    """K: key/value heads."""
    d_ff: int = 2816
    """F: SwiGLU width."""
    vocab: int = 32000
    """V: vocabulary."""

    def arch(self) -> ArchConfig:
        """The bench model with these sizes."""
        from rlvr_jax.models import ArchConfig

        return ArchConfig.from_hf(hf_config_dict(self))

    def model(self, seed: int = 0, dtype: str = "float32") -> Any:
        """The bench model of these sizes, seeded random weights, stored and computed in `dtype`."""
        import jax

        from rlvr_jax import models

        arch, compute = self.arch(), jax.numpy.dtype(dtype)
        params = models.init_params(arch, jax.random.key(seed), dtype)
        return models.Model(arch, params, compute_dtype=compute)


TINY_SIZES = dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, vocab=512)
"""The smoke runs' model: 2 layers of D=64 (`--quick` everywhere)."""
SIZES_1B = dict(d_model=2048, n_layers=20, n_heads=16, n_kv_heads=4, d_ff=5632)
"""≈0.97B params (20 layers of D=2048, F=5632, 16 heads of 128, 4 KV heads): the GPU presets'."""


def hf_config_dict(sizes: ModelSize) -> dict:
    """The HF Qwen2 config of the bench model of `sizes` (tied embeddings, GQA, q/k/v biases)."""
    return {
        "model_type": "qwen2",
        "vocab_size": sizes.vocab,
        "hidden_size": sizes.d_model,
        "intermediate_size": sizes.d_ff,
        "num_hidden_layers": sizes.n_layers,
        "num_attention_heads": sizes.n_heads,
        "num_key_value_heads": sizes.n_kv_heads,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
    }


def matmul_params(arch: ArchConfig) -> int:
    """Parameters that take part in a matmul per token: every layer's projections and the LM
    head (V·D, tied or not); norms, biases and the embedding lookup are left out."""
    d, n, k, h, f = arch.d_model, arch.n_heads, arch.n_kv_heads, arch.head_dim, arch.d_ff
    per_layer = d * n * h + 2 * d * k * h + n * h * d + 3 * d * f
    return arch.n_layers * per_layer + arch.vocab_size * d


def token_flops(arch: ArchConfig, context: float) -> float:
    """Forward FLOPs of one token attending to `context` positions: 2·P_matmul plus attention
    (q·k and p·v: 2·2·L·N·H per key). The one FLOP model of the learner and decode benches."""
    attention = 4.0 * arch.n_layers * arch.n_heads * arch.head_dim * context
    return 2.0 * matmul_params(arch) + attention


WEIGHT_BYTES = {"float32": 4, "bfloat16": 2, "int8": 1, "fp8": 1}
"""Bytes per matmul weight of each decode weight dtype."""


def step_bandwidth(
    arch: ArchConfig, roof: Mapping[str, Any], step_s: float, *, slots: int, context: float,
    param_bytes: int, cache_bytes: int,
) -> dict[str, Any]:  # fmt: skip
    """A decode step of `step_s` seconds against the least bytes it must read: every matmul
    weight once and each of `slots` sequences' cached K and V over `context` positions; its GB/s
    as a fraction of `roof`'s measured bandwidth and of the datasheet's HBM (GPU/TPU)."""
    kv = 2 * arch.n_layers * arch.n_kv_heads * arch.head_dim * cache_bytes
    step_bytes = matmul_params(arch) * param_bytes + slots * context * kv
    gbps, sheet = step_bytes / step_s / 1e9, roof["datasheet"]
    return {"step_bytes": step_bytes, "step_gbps": gbps,
            "memory_fraction": gbps / roof["memory_gbps"],
            "memory_fraction_datasheet": sheet and gbps / sheet["hbm_gbps"]}  # fmt: skip


def forward_flops(arch: ArchConfig, rows: int, seq: int) -> float:
    """FLOPs of one forward over `rows` × `seq` tokens, each attending to `seq` keys."""
    return rows * seq * token_flops(arch, seq)


def train_flops(arch: ArchConfig, rows: int, seq: int) -> float:
    """FLOPs of one training step (forward + backward) = 3 × `forward_flops`."""
    return 3.0 * forward_flops(arch, rows, seq)


@dataclasses.dataclass(frozen=True)
class Timings:
    """Timed calls of one function."""

    wall_s: tuple[float, ...]
    """Wall seconds of each call."""
    cpu_s: tuple[float, ...]
    """CPU seconds this process used during each call (all its threads)."""

    @property
    def best(self) -> float:
        """The fastest call's wall seconds (the least disturbed by other processes)."""
        return min(self.wall_s)

    def cpu_share(self, cpus: int) -> float:
        """CPU seconds / (wall seconds × `cpus`) of the fastest call: near 1 when the process
        had every core to itself, lower when other processes took some (a shared machine)."""
        i = self.wall_s.index(self.best)
        return self.cpu_s[i] / (self.wall_s[i] * cpus)


def time_calls(fns: Mapping[str, Callable[[], Any]], repeats: int) -> dict[str, Timings]:
    """Times `repeats` interleaved rounds of a call of each of `fns`, each to its result, after a
    warm-up call of each: a load change on a shared machine hits every contender alike."""
    import jax

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for fn in fns.values():
        jax.block_until_ready(fn())
    wall: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    for _ in progress.steps(range(repeats), "timed round"):
        for name, fn in fns.items():
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(fn())
            wall[name].append(time.perf_counter() - start_wall)
            cpu[name].append(time.process_time() - start_cpu)
    return {name: Timings(tuple(wall[name]), tuple(cpu[name])) for name in fns}


def compile_ahead(fn: Callable, *args: Any, donate: tuple[int, ...] = ()) -> tuple[Any, float]:
    """(`fn` jitted and compiled ahead of time for `args`, compile seconds)."""
    import jax

    progress.line(f"compiling {getattr(fn, '__name__', type(fn).__name__)}")
    start = time.perf_counter()
    compiled = jax.jit(fn, donate_argnums=donate).lower(*args).compile()
    return compiled, time.perf_counter() - start


def compiled_memory(compiled: Any) -> dict[str, int] | None:
    """XLA's buffer sizes of a compiled computation (temp: activations, workspace), or None."""
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    return {
        "temp_bytes": int(stats.temp_size_in_bytes),
        "argument_bytes": int(stats.argument_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
    }


_DEVICE_PLANES = ("/device:GPU", "/device:TPU")
"""Profiler planes of accelerators (their host planes then hold only launches)."""


def trace_op_times(fn: Callable[[], Any], trace_dir: str | Path) -> dict[str, tuple[int, int]]:
    """Runs `fn` once under the JAX profiler (traces into `trace_dir`); each compiled op's (total
    ns, calls), op names as in the compiled HLO: on a CPU the runtime's events with an `hlo_op`
    stat, on a GPU / TPU the device planes' "XLA Ops" line (else their `hlo_op` events)."""
    import jax
    from jax.profiler import ProfileData

    trace_dir = Path(trace_dir)
    with jax.profiler.trace(str(trace_dir), create_perfetto_trace=True):
        fn()
    planes = sorted(trace_dir.glob("**/*.xplane.pb"), key=lambda f: f.stat().st_mtime)
    if not planes:
        raise RuntimeError(f"the profiler wrote no XSpace (*.xplane.pb) under {trace_dir}")
    data = ProfileData.from_file(str(planes[-1]))
    device = [p for p in data.planes if p.name.startswith(_DEVICE_PLANES)]
    times: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for plane in device or [p for p in data.planes if p.name.startswith("/host:CPU")]:
        lines = list(plane.lines)
        ops_lines = [ln for ln in lines if ln.name == "XLA Ops"] if device else []
        for line in ops_lines or lines:
            for event in line.events:
                op = event.name if ops_lines else dict(event.stats).get("hlo_op")
                if op:
                    times[op][0] += int(event.duration_ns)
                    times[op][1] += 1
    return {op: (ns, calls) for op, (ns, calls) in times.items()}


def op_profile(fn: Callable[[], Any], trace_dir: str | Path, top: int = 15) -> list[dict]:
    """`fn`'s `top` ops by total time (`trace_op_times`): `{"op", "ms", "calls", "share"}`."""
    times = trace_op_times(fn, trace_dir)
    all_ns = sum(ns for ns, _ in times.values()) or 1
    ranked = sorted(times.items(), key=lambda kv: -kv[1][0])[:top]
    return [
        {"op": name, "ms": ns / 1e6, "calls": calls, "share": ns / all_ns}
        for name, (ns, calls) in ranked
    ]


CPU_ISA_FLAGS = ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx2", "fma")
"""The /proc/cpuinfo flags `cpu_info` reports, widest first: XLA:CPU's matmul peak on an
AVX-512 core with AMX is ~2-6x an AVX2 core's, so a CPU figure means little without them."""


def cpu_info(cpuinfo: str | Path = "/proc/cpuinfo") -> dict[str, Any]:
    """The CPU's `cpu_model` and the `CPU_ISA_FLAGS` it has (`cpu_isa`); {} where unreadable."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return {}
    model, flags = None, set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return {"cpu_model": model, "cpu_isa": [f for f in CPU_ISA_FLAGS if f in flags]}


def machine_info(load_before: Any = None) -> dict[str, Any]:
    """Where a benchmark ran: device, host, CPUs (`cpu_info`), jax version and the load averages
    (with `load_before`, the run's start's: also `loadavg_before` and `loadavg_after`)."""
    import platform

    import jax

    device = jax.devices()[0]
    info = {
        "platform": device.platform,
        "device_kind": device.device_kind,
        "n_devices": jax.device_count(),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        **cpu_info(),
        "jax": jax.__version__,
        "loadavg": list(os.getloadavg()),
    }
    if load_before is not None:
        info.update(loadavg_before=load_before, loadavg_after=os.getloadavg())
    return info


def jsonable(value: Any) -> Any:
    """`value` with numpy scalars/arrays as Python numbers/lists, tuples as lists, dataclasses
    as dicts and non-finite floats as None (JSON has no NaN)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, str):  # numpy scalars and arrays
        return jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path: str | Path, result: Mapping[str, Any]) -> Path:
    """Writes `result` as indented JSON (parent directories created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(jsonable(result), indent=2, allow_nan=False) + "\n")
    return path


def flatten(nested: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Leaves of a nested dict under slash-joined keys: {"a": {"b": 1}} -> {"a/b": 1}."""
    out: dict[str, Any] = {}
    for key, value in nested.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def lookup(nested: Mapping[str, Any], path: str) -> Any:
    """The value at a slash-joined `path` of a nested dict, or None where a key is missing."""
    node: Any = nested
    for key in path.split("/"):
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def format_value(value: Any) -> str:
    """A table cell: ints as they are, floats with 4 significant digits, None as '-'."""
    if value is None:
        return "-"
    if not isinstance(value, float) or not math.isfinite(value):  # ints, bools, text
        return str(value)
    if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
        return f"{value:.3e}"
    return f"{value:.4g}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table: header, rule, a line per row; text left-, numbers right-aligned."""
    if any(len(r) != len(headers) for r in rows):
        raise ValueError(f"every row needs {len(headers)} cells (the headers: {list(headers)})")
    cells = [[format_value(v) for v in row] for row in rows]
    numeric = [
        all(isinstance(row[i], int | float) or row[i] is None for row in rows) and bool(rows)
        for i in range(len(headers))
    ]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, cells)])


@dataclasses.dataclass(frozen=True)
class Panel:
    """One subplot: bars (label -> value) or lines (label -> (x values, y values))."""

    title: str
    ylabel: str
    bars: Mapping[str, float] | None = None
    lines: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None
    xlabel: str = ""
    logx: bool = False

    def __post_init__(self) -> None:
        if (self.bars is None) == (self.lines is None):
            raise ValueError(f"panel {self.title!r}: give exactly one of bars or lines")


def save_plot(path: str | Path, panels: Sequence[Panel], title: str) -> Path:
    """Draws `panels` side by side into a PNG at `path` (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not panels:
        raise ValueError("save_plot needs at least one panel")
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"plots are written as PNG: {path} should end in .png")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        if panel.bars is not None:
            labels = list(panel.bars)
            values = [panel.bars[k] for k in labels]
            drawn = ax.bar(range(len(labels)), values, color="tab:blue")
            ax.bar_label(drawn, labels=[format_value(v) for v in values], fontsize=8)
            ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
        else:
            for label, (xs, ys) in panel.lines.items():
                ax.plot(list(xs), list(ys), marker="o" if len(xs) < 20 else None, label=label)
            ax.legend(fontsize=8)
            if panel.logx:
                ax.set_xscale("log", base=2)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
