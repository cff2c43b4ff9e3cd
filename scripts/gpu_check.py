"""The driver of `scripts/gpu_check.sh` (read docs/gpu_check.md): every part in its own
process under its own time cap, going on past a part that fails or runs out of time; one JSON
(`gpu_check.json`), one summary table (`summary.txt`) and one log (`gpu_check.log`) in the
output folder, rewritten after each part so that a cut-off run still leaves what it measured.

    python scripts/gpu_check.py [--out DIR] [--budget S] [--only a,b] [--skip a,b] [--cpu-smoke]
    python scripts/gpu_check.py --part NAME --json FILE [--cpu-smoke]   (one part, in-process)

Nothing is installed: the project is imported from this working tree. With `--cpu-smoke` every
part runs tiny on the CPU, with the packages the GPU image lacks made unimportable
(`ABSENT`, through a `sitecustomize` on PYTHONPATH that reaches the parts' child processes
too), so the smoke proves the GPU parts do not need them.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ABSENT = ("tensorflow", "tensorflow_datasets", "jetstream", "tensorboardX", "langdetect",
          "vllm", "trl", "nltk")  # fmt: skip
"""Packages of our dependency list (or optional peers) that the GPU image does not have."""
WHEELS = ("qwix",)
"""Pure-Python wheels the GPU parts need carried to the image: qwix, for decode-profile's int8
engine (quantized decode weights; nothing else imports it, which the smoke proves for the rest)."""


@dataclasses.dataclass(frozen=True)
class Part:
    """One part of the check."""

    name: str
    cap_s: int
    """Seconds it may take on the GPU (plus what earlier parts left unused)."""
    gpu: tuple[str, ...]
    """`rlvr-bench` arguments on the GPU (empty: a part of this script's own)."""
    smoke: tuple[str, ...]
    """`rlvr-bench` arguments of `--cpu-smoke`."""
    headlines: tuple[str, ...]
    """Slash paths of the figures the summary shows."""


DECODE_FIGURES = ("tokens_per_s/continuous", "tokens_per_s/hf_generate",
                  "ratios/continuous_over_hf_tokens_per_s", "decode_step_memory_fraction",
                  "profile/decode_step_memory_fraction_datasheet", "profile/decode_ms_per_step",
                  "roofline_fraction", "machine/hf_device")  # fmt: skip
STEP_FIGURES = (*(f"step/{shape} {wd}/{figure}" for shape in ("32x192", "256x1024")
                   for wd in ("bfloat16", "int8")
                   for figure in ("ms_per_step", "memory_fraction_datasheet")),
                "ratios", "op_profile/32x192 bfloat16/parts",
                "op_profile/32x192 int8/parts")  # fmt: skip
"""decode-profile: the 0.97B step at 32 slots (the bench's batch) and at 256 slots x 1K context,
bf16 and int8 weights, and where the 32-slot steps' time goes (the top ops are in the part's
JSON, `top_ops`)."""
E2E = ("--warmup", "1", "--rounds", "1", "--set", "filter.zero_variance=false")
"""e2e: one round, every group trained (a random policy's rewards are mostly all equal: the
zero-variance filter would leave nothing to train)."""
PARTS = (
    Part("env", 15, (), (), ("device_kind", "jax", "torch", "torch_cuda", "nvidia_smi", "absent")),
    Part("parity", 90, (), (), ("ok", "checks")),
    Part("roofline", 25, ("roofline",), ("roofline", "--quick"),
         ("matmul_gflops/bfloat16", "datasheet/bf16_fraction", "memory_gbps",
          "datasheet/memory_fraction", "datasheet/name")),
    Part("learner", 60, ("learner", "--preset", "gpu-1b", "--repeats", "3", "--no-profile"),
         ("learner", "--quick", "--no-profile"),
         ("mfu/train_step", "mfu/datasheet", "tokens_per_s/train_step", "achieved_flops_fraction",
          "config/attention_kernel", "seconds/compile/train_step")),
    Part("decode-bench", 60, ("decode", "--dtype", "bfloat16"),
         ("decode", "--quick", "--dtype", "bfloat16"), DECODE_FIGURES),
    Part("decode-1b", 80, ("decode", "--preset", "gpu-1b"),
         ("decode", "--quick", "--dtype", "bfloat16", "--repeats", "1", "--skip-hf"),
         DECODE_FIGURES),
    Part("decode-profile", 120,
         ("decode", "--workload", "step", "--preset", "gpu-1b", "--weight-dtype", "int8",
          "--profile", "--repeats", "3"),
         ("decode", "--workload", "step", "--quick", "--dtype", "bfloat16", "--profile",
          "--repeats", "1", "--shapes", "4x32"),
         STEP_FIGURES),
    Part("decode-long", 60,
         ("decode", "--workload", "long", "--dtype", "bfloat16", "--long-capacity", "1024",
          "--long-requests", "32"),
         ("decode", "--workload", "long", "--quick", "--dtype", "bfloat16"),
         ("long/ratios/paged_over_contiguous_tokens_per_s", "long/tokens_per_s",
          "long/mean_concurrent")),
    Part("e2e", 90, ("e2e", "--preset", "bench", "--steps", "2", *E2E),
         ("e2e", "--quick", "--steps", "1", *E2E),
         ("steps_per_s", "tokens_per_s", "ratios/async_over_sync", "modes/async/busy_s/train",
          "modes/sync/busy_s/train", "quiet")),
)  # fmt: skip
"""The parts, in the order they run (the targets of issue 24 first)."""
BUDGET_S = 540
"""The whole check's default wall budget: 9 minutes, under the device tool's 10-minute command
limit (the caps add up to 600 s: a part the budget no longer reaches is recorded as skipped)."""
SMOKE_BUDGET_S = 175
"""`--cpu-smoke`'s wall budget: under 3 minutes in all, each part capped by what is left."""


# ---- one part, in this process ---------------------------------------------------------


def env_info() -> dict[str, Any]:
    """The machine and the software the parts ran on."""
    import jax

    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "devices": len(jax.devices()),
        "absent": [n for n in ABSENT if importlib.util.find_spec(n) is None],
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
    }
    for name in ("jaxlib", "flax", "optax", "orbax-checkpoint", "transformers", "numpy", "sympy"):
        try:
            info[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info[name] = "not installed"
    import torch

    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.cuda.is_available()
    smi = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem",
           "--format=csv,noheader"]  # fmt: skip
    try:
        info["nvidia_smi"] = subprocess.run(
            smi, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        info["nvidia_smi"] = f"unavailable: {e}"
    return info


def run_part(name: str, json_path: str, smoke: bool) -> int:
    """Runs part `name` here, writing its JSON to `json_path`; its exit code."""
    part = {p.name: p for p in PARTS}[name]
    if name == "env":
        Path(json_path).write_text(json.dumps(env_info(), indent=2))
        return 0
    if name == "parity":
        sys.path.insert(0, str(ROOT / "scripts"))
        import gpu_parity

        return gpu_parity.main(["--json", json_path, *(["--cpu-smoke"] if smoke else [])])
    from rlvr_jax.cli import bench_main

    return bench_main([*(part.smoke if smoke else part.gpu), "--json", json_path])


# ---- the driver ------------------------------------------------------------------------


def absent_packages_dir() -> str:
    """A folder whose `sitecustomize` makes every `ABSENT` package unimportable (as on the GPU
    image: `import` raises ModuleNotFoundError, `importlib.util.find_spec` returns None)."""
    path = tempfile.mkdtemp(prefix="gpu-check-absent-")
    Path(path, "sitecustomize.py").write_text(
        f"import sys\n\nfor _name in {ABSENT!r}:\n    sys.modules[_name] = None\n"
    )
    return path


def run_subprocess(cmd: list[str], env: dict[str, str], cap_s: float, log: Any) -> tuple[int, str]:
    """Runs `cmd` in its own process group, output appended to `log`; (exit code, status).
    Past `cap_s` the whole group gets SIGTERM, then SIGKILL 10 s later (status "timeout")."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        return proc.wait(timeout=cap_s), "done"
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
                return proc.wait(timeout=grace), "timeout"
            except ProcessLookupError:
                return proc.wait(), "timeout"
            except subprocess.TimeoutExpired:
                continue
        return -9, "timeout"


def tail(path: Path, start: int, lines: int = 12) -> str:
    """The last `lines` lines of `path` written after byte `start`."""
    with open(path, "rb") as f:
        f.seek(start)
        return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])


def headlines(part: Part, out: dict[str, Any]) -> dict[str, Any]:
    """The figures of one part's result the summary shows (numbers stay numbers)."""
    from rlvr_jax.bench.common import lookup

    if part.name == "parity":
        return {
            name: ("ok" if c["ok"] else "FAILED")
            + (f", worst error {max(c['errors'].values()):.2e}" if c.get("errors") else "")
            + (f", logprob gap {c['max_logprob_gap']:.2e}" if "max_logprob_gap" in c else "")
            + (f": {c['error']}" if "error" in c else "")
            for name, c in out.get("checks", {}).items()
        }
    figures = {}
    for path in part.headlines:
        value = lookup(out, path)
        if isinstance(value, dict):
            figures.update({f"{path}/{k}": v for k, v in value.items()})
        elif isinstance(value, list):
            figures[path] = ", ".join(map(str, value)) or "-"
        elif value is not None:
            figures[path] = value
    return figures


def summarize(result: dict[str, Any]) -> str:
    """One table: each part's status, seconds and headline figures."""
    from rlvr_jax.bench.common import format_table

    rows = []
    for part in PARTS:
        entry = result["parts"].get(part.name)
        if entry is None:
            continue
        state = f"{entry['status']} ({entry['seconds']:.0f} s)"
        figures = headlines(part, entry.get("result") or {})
        if entry["status"] != "ok":
            figures = {"error": entry.get("error", ""), **figures}
        for i, (figure, value) in enumerate(figures.items() or [("-", None)]):
            rows.append([part.name if i == 0 else "", state if i == 0 else "", figure, value])
    mode = "cpu-smoke" if result["config"]["cpu_smoke"] else "gpu"
    head = f"scripts/gpu_check.sh ({mode}) on {result['device']}, {result['wall_s']:.0f} s"
    return head + "\n" + format_table(["part", "status", "figure", "value"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="output folder (default: $OUT, else runs/gpu_check)")
    p.add_argument("--budget", type=float, help=f"wall seconds in all (default {BUDGET_S})")
    p.add_argument("--only", help="comma-separated parts to run")
    p.add_argument("--skip", help="comma-separated parts to leave out")
    p.add_argument("--cpu-smoke", action="store_true", help="every part tiny on the CPU")
    p.add_argument("--part", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.part:
        return run_part(args.part, args.json, args.cpu_smoke)
    names = [n.name for n in PARTS]
    only = [n for n in (args.only or "").split(",") if n]
    skip = [n for n in (args.skip or "").split(",") if n]
    unknown = sorted(set(only + skip) - set(names))
    if unknown:
        p.error(f"unknown part(s) {unknown}; parts: {', '.join(names)}")
    parts = [q for q in PARTS if (not only or q.name in only) and q.name not in skip]
    out = Path(args.out or os.environ.get("OUT") or ROOT / "runs" / "gpu_check")
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    # the parts share their compiles: in this run's own cache, or in the one the caller set
    # (the test suite's, whose other tests compile some of the same programs)
    env.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="gpu-check-xla-cache-"))
    env.update(JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")  # fmt: skip
    if args.cpu_smoke:
        env["JAX_PLATFORMS"] = "cpu"
        env["PYTHONPATH"] = os.pathsep.join([absent_packages_dir(), env.get("PYTHONPATH", "")])
    budget = args.budget or (SMOKE_BUDGET_S if args.cpu_smoke else BUDGET_S)
    result: dict[str, Any] = {"parts": {}, "device": "?", "wall_s": 0.0, "config": {
        "cpu_smoke": args.cpu_smoke, "budget_s": budget, "parts": [q.name for q in parts],
        "absent": list(ABSENT), "wheels_carried": list(WHEELS)}}  # fmt: skip
    start, banked = time.perf_counter(), 0.0
    log_path = out / "gpu_check.log"
    with open(log_path, "ab") as log, tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for part in parts:
            left = budget - (time.perf_counter() - start)
            cap = left if args.cpu_smoke else min(part.cap_s + banked, left)
            if cap < 5:
                result["parts"][part.name] = {"status": "skipped", "seconds": 0.0,
                                              "error": "no time left in the budget"}  # fmt: skip
                continue
            print(f"== {part.name}: cap {cap:.0f} s", flush=True)
            log.write(f"\n===== {part.name} (cap {cap:.0f} s) =====\n".encode())
            log.flush()
            at, t0 = log.tell(), time.perf_counter()
            json_path = Path(tmp) / f"{part.name}.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--part", part.name]
            cmd += ["--json", str(json_path), *(["--cpu-smoke"] if args.cpu_smoke else [])]
            code, how = run_subprocess(cmd, env, cap, log)
            seconds = time.perf_counter() - t0
            banked = max(0.0, cap - seconds)
            entry: dict[str, Any] = {"status": "ok", "seconds": seconds, "exit_code": code}
            if json_path.exists():
                entry["result"] = json.loads(json_path.read_text())
            if how == "timeout":
                entry.update(status="timeout", error=f"stopped at its {cap:.0f} s cap")
            elif code != 0 or "result" not in entry:
                entry.update(status="failed", error=tail(log_path, at, 3).replace("\n", " | "))
            if entry["status"] != "ok":
                print(tail(log_path, at), flush=True)
            print(f"== {part.name}: {entry['status']} in {seconds:.0f} s", flush=True)
            result["parts"][part.name] = entry
            if part.name == "env" and "result" in entry:
                result["device"] = entry["result"]["device_kind"]
            result["wall_s"] = time.perf_counter() - start
            (out / "gpu_check.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
            (out / "summary.txt").write_text(summarize(result) + "\n")
    (out / "summary.txt").write_text(summarize(result) + "\n")
    print("\n" + (out / "summary.txt").read_text(), flush=True)
    print(f"wrote {out / 'gpu_check.json'}, {out / 'summary.txt'}, {log_path}", flush=True)
    return 0 if all(e["status"] == "ok" for e in result["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
