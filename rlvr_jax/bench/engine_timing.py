"""Engine timings shared by the decode benchmarks: interleaved best-of-rounds wall times, forced
lengths through the scheduler, prefill and decode-step seconds, the host's share of a scheduled
run, and the decode step op by op (`step_profile`, XLA's op names as in an `--xla_dump_to` dump)."""

from __future__ import annotations

import collections
import re
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from rlvr_jax.bench import common, progress
from rlvr_jax.rollout import EngineCore, GroupRequest, Scheduler, SlotRequest
from rlvr_jax.rollout.device import decode as device_decode
from rlvr_jax.rollout.device.sampling import SamplerMode


def interleaved_best(fns: dict[str, Callable[[], Any]], repeats: int) -> tuple[dict, dict]:
    """Best wall time (and its output) of each fn, timed in interleaved rounds (`time_calls`)."""
    best = {name: float("inf") for name in fns}
    outputs: dict[str, Any] = {}
    for r in range(repeats):
        if len(fns) > 1:  # a comparison (single probes are quick)
            progress.line(f"timing {', '.join(fns)}: round {r + 1}/{repeats}")
        for name, fn in fns.items():
            start = time.perf_counter()
            out = fn()
            seconds = time.perf_counter() - start
            if seconds < best[name]:
                best[name], outputs[name] = seconds, out
    return best, outputs


def timed_generate(
    fns: dict[str, Callable[[], Any]], repeats: int, n_tokens: int, warm: Any = None
) -> tuple[dict, dict]:
    """`fns` (those named in `warm`, default all) called once to compile and warm up, then
    `interleaved_best`; every output that is a list of completions must hold `n_tokens` tokens."""
    progress.line(f"compiling and warming up {', '.join(fns if warm is None else warm)}")
    for name in fns if warm is None else warm:
        fns[name]()
    walls, outs = interleaved_best(fns, repeats)
    for name, out in outs.items():
        if isinstance(out, list) and sum(len(c.tokens) for c in out) != n_tokens:
            raise RuntimeError(f"{name}: wrong number of generated tokens")
    return walls, outs


def roofline_fractions(arch: Any, cfg: Any, roof: dict, walls: dict[str, float]) -> dict:
    """Model FLOPs (at the mean context) of `cfg`'s throughput workload per wall second of each
    of `walls`, over `roof`'s fp32 matmul peak."""
    work = cfg.batch * (cfg.prompt + cfg.new) * common.token_flops(arch, cfg.prompt + cfg.new / 2)
    return {k: work / wall / (roof["peak_gflops_fp32"] * 1e9) for k, wall in walls.items()}


def run_lengths(core: EngineCore, prompts: list, lengths: list[int], batching: str) -> Any:
    """Every prompt decoded to its length (no stop token) through a `Scheduler` of `batching`;
    the scheduler's counters (`SchedulerStats`)."""
    sched = Scheduler(core, batching=batching)
    for i, (prompt, n) in enumerate(zip(prompts, lengths)):
        sched.add(GroupRequest(i, i, tuple(prompt), 1, seed=i, max_new_tokens=int(n)))
    got = {req.key: len(group[0].tokens) for req, group in sched.run()}
    bad = [i for i, n in enumerate(lengths) if got.get(i) != int(n)]
    if bad:
        raise RuntimeError(f"{batching}: requests {bad[:5]} did not generate their forced lengths")
    return sched.stats


class LiveSlots:
    """`core` with every slot live on one prompt: `chunk()` runs `core.chunk` decode steps and
    waits; `hlo()` compiles that program (run by the chunks from then on), its HLO text."""

    def __init__(self, core: EngineCore, prompt: list[int]):
        self.core, slots, self.compiled = core, list(range(core.spec.max_slots)), None
        requests = [SlotRequest(0, i, 10**6) for i in slots]
        prefix = core.prefill(core.params, prompt)
        self.state = core.insert(prefix, core.init_decode_state(), slots, requests)
        self.args = (np.int32(core.spec.max_slots + 1), core.spec.kv_layout.default_work(core.spec))

    def chunk(self) -> Any:
        if self.compiled is None:
            self.state, out = self.core.generate(self.core.params, self.state, mode=SamplerMode())
        else:
            self.state, out = self.compiled(self.core.params, self.state, *self.args)
        return jax.block_until_ready(out)

    def hlo(self) -> str:
        if self.compiled is None:
            kw = dict(spec=self.core.spec, n_steps=self.core.chunk, mode=SamplerMode())
            lowered = device_decode.generate.lower(self.core.params, self.state, *self.args, **kw)
            self.compiled = lowered.compile()
        return self.compiled.as_text()


def profile_engine(core: EngineCore, prompts: list[list[int]], repeats: int) -> dict:
    """Seconds per prefill of one prompt and per decode step with every slot live."""
    prefix, one = core.prefill(core.params, prompts[0]), [SlotRequest(0, 0, 10**6)]
    holder = {"state": core.init_decode_state()}

    def prefill() -> Any:
        holder["state"] = core.insert(prefix, holder["state"], [0], one)
        return jax.block_until_ready(holder["state"].tokens_B)

    prefill_s = interleaved_best({"prefill": prefill}, repeats + 2)[0]["prefill"]
    del holder["state"]
    live = LiveSlots(core, prompts[0])
    live.chunk()
    chunk_s = interleaved_best({"chunk": live.chunk}, repeats + 2)[0]["chunk"]
    return {"prefill_s_per_prompt": prefill_s, "decode_ms_per_step": 1e3 * chunk_s / core.chunk}


PARTS = ("embed", "qkv", "attention", "o_proj", "mlp", "lm_head", "sample")
"""The decode step's named scopes (`device.kernel.run_layers`, `device.decode`'s sampler)."""
_CONTROL = ("while", "conditional", "call")
"""Opcodes whose trace events wrap other ops' (not counted)."""
_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def _closing(text: str) -> int:
    """Index of the parenthesis closing `text`'s first one."""
    depth = 0
    for i, c in enumerate(text):
        depth += (c == "(") - (c == ")")
        if depth == 0:
            return i
    return len(text) - 1


def _part(line: str) -> str | None:
    """The innermost `PARTS` scope of an HLO line's op_name, None without one."""
    m = _OP_NAME.search(line)
    return next((p for p in reversed(m.group(1).split("/")) if p in PARTS), None) if m else None


def hlo_ops(hlo_text: str) -> dict[str, dict[str, str]]:
    """Every instruction of a compiled module's HLO text: name -> {"opcode", "part" (`_part`,
    or a fusion's commonest among its callees', else "other"), "what" (`dot f32[..] x ..`)}."""
    shapes, rows, called, computation = {}, [], {}, None
    for line in hlo_text.splitlines():
        if line.startswith(("%", "ENTRY")) and line.rstrip().endswith("{"):
            computation = line.removeprefix("ENTRY ")[1:].split(" ", 1)[0]
            called[computation] = collections.Counter()
        if (m := _INSTR.match(line)) is None:
            continue
        if computation is not None and (part := _part(line)) is not None:
            called[computation][part] += 1
        name, rest = m.groups()
        end = _closing(rest) + 1 if rest.startswith("(") else rest.find(" ")  # tuple shapes
        shape, rest = re.sub(r"\{[^}]*\}", "", rest[:end]), rest[end:].lstrip()  # no layouts
        shapes[name] = shape
        rows.append((name, shape, *rest.partition("(")[::2]))
    out = {}
    for name, shape, opcode, rest in rows:
        args = re.findall(r"%([\w.\-]+)", rest[: _closing("(" + rest)])
        op_name, calls = _OP_NAME.search(rest), re.search(r"calls=%([\w.\-]+)", rest)
        part = _part(rest)
        if part is None and calls and called.get(calls.group(1)):
            part = called[calls.group(1)].most_common(1)[0][0]
        kind = op_name.group(1).split("/")[-1] if op_name else opcode
        kind = "dot" if kind == "dot_general" else kind
        what = f"{kind} {' x '.join(shapes.get(a, '?') for a in args[:3])} -> {shape}"
        out[name] = {"opcode": opcode, "part": part or "other", "what": what}
    return out


def step_profile(live: LiveSlots, name: str, top: int = 12) -> tuple[dict, dict]:
    """`live`'s decode chunk traced, its ops labelled by `hlo_ops` (control flow left out):
    ({"op_ms_per_step", "parts": ms per step by `PARTS`}, the `top` ops keyed "<name> <op>")."""
    ops, steps = hlo_ops(live.hlo()), live.core.chunk
    live.chunk()  # warm
    with tempfile.TemporaryDirectory() as tmp:
        times = common.trace_op_times(live.chunk, tmp)
    unknown = {"opcode": "?", "part": "other", "what": "?"}
    rows = [(ns, op, calls, ops.get(op, unknown)) for op, (ns, calls) in times.items()]
    rows = sorted((r for r in rows if r[3]["opcode"] not in _CONTROL), key=lambda r: -r[0])
    total = sum(r[0] for r in rows) or 1
    parts: collections.Counter = collections.Counter()
    for ns, _, _, info in rows:
        parts[info["part"]] += ns / 1e6 / steps
    summary = {"op_ms_per_step": total / 1e6 / steps, "parts": dict(parts.most_common())}
    top_ops = {f"{name} {op}": dict(part=info["part"], ms_per_step=ns / 1e6 / steps,
                                    share=ns / total, calls_per_step=calls / steps,
                                    what=info["what"])
               for ns, op, calls, info in rows[:top]}  # fmt: skip
    return summary, top_ops


DEVICE_CALLS = (
    "init_decode_state", "prefill", "insert", "extend", "activate", "deactivate", "generate",
    "copy_pages", "move_slots",
)  # fmt: skip
"""The `EngineCore` methods that run device work (the scheduler's every call into the device)."""


def host_share(core: EngineCore, run: Callable[[], Any]) -> dict[str, float]:
    """`run()` (driving `core` through a `Scheduler`) with every device call timed to its result:
    the host's seconds are the wall's rest (not how much of it a pipelined run would hide)."""
    device = [0.0]

    def timed(fn: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return jax.block_until_ready(fn(*args, **kwargs))
            finally:
                device[0] += time.perf_counter() - start

        return call

    for name in DEVICE_CALLS:  # instance attributes shadow the methods while the run lasts
        setattr(core, name, timed(getattr(core, name)))
    try:
        start = time.perf_counter()
        run()
        wall = time.perf_counter() - start
    finally:
        for name in DEVICE_CALLS:
            delattr(core, name)
    return {"wall_s": wall, "device_s": device[0], "host_s": wall - device[0],
            "share": (wall - device[0]) / wall}  # fmt: skip
