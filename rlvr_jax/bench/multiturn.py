"""`rlvr-bench decode --workload multiturn`: tool-using episodes on one engine, two ways.

Each episode has `turns` assistant turns, a tool response of `tool_min`–`tool_max` tokens after
each but the last: `in_slot` (one multi-turn request, `GroupRequest.turns`: the response
appended in place) against `reprefill` (each turn a new request for the whole conversation, as
a server without a prefix cache), on the same engine. Sampling keyed by (seed, sample,
position) makes both generate the same tokens (checked within 1%)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
from typing import Any

import numpy as np

from rlvr_jax.bench import common, progress


@dataclasses.dataclass(frozen=True)
class MultiturnConfig(common.ModelSize):
    """Sizes of the multi-turn workload (the model's: `common.ModelSize`)."""

    episodes: int = 64
    slots: int = 32
    prompt: int = 64
    turns: int = 4
    turn_tokens: int = 48
    """Mean assistant turn length (sets the number of stop ids)."""
    tool_min: int = 32
    tool_max: int = 128
    budget: int = 768
    """Tokens per episode after the prompt (turns and tool responses)."""
    chunk: int = 8
    repeats: int = 2
    seed: int = 0


QUICK = MultiturnConfig(
    **common.TINY_SIZES, episodes=6, slots=4, prompt=8, turn_tokens=16, tool_min=4,
    tool_max=12, budget=128, chunk=4, repeats=1,
)  # fmt: skip


def tool_response(cfg: MultiturnConfig, episode: int, turn: int) -> list[int]:
    """The tool response appended after `turn` of `episode` (ids past the stop range)."""
    rng = np.random.default_rng([cfg.seed, episode, turn])
    n = int(rng.integers(cfg.tool_min, cfg.tool_max + 1))
    stops = cfg.vocab // cfg.turn_tokens
    return rng.integers(stops, cfg.vocab, n).tolist()


class _Hook:
    """In-slot turns: the tool response after each of the first `turns - 1` turns."""

    def __init__(self, cfg: MultiturnConfig, episode: int):
        self.cfg, self.index, self.turn = cfg, episode, 0

    def next_turn(self, sample_index: int, tokens: list[int], finish_reason: str):
        self.turn += 1
        done = finish_reason != "stop" or self.turn >= self.cfg.turns
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(None if done else tool_response(self.cfg, self.index, self.turn))
        return future

    def episode(self, sample_index: int) -> int:
        return self.turn


def run_in_slot(core: Any, cfg: MultiturnConfig, prompts: list[list[int]]) -> dict:
    """The workload with in-place turns; returns token counts."""
    from rlvr_jax.rollout import GroupRequest, Scheduler

    sched, stops = Scheduler(core), tuple(range(cfg.vocab // cfg.turn_tokens))
    for i, p in enumerate(prompts):
        sched.add(GroupRequest(i, i, tuple(p), 1, seed=i, max_new_tokens=cfg.budget,
                               stop_token_ids=stops, turns=_Hook(cfg, i)))  # fmt: skip
    done = [c for _, group in sched.run() for c in group]
    generated = sum(sum(c.sampled or [True] * len(c.tokens)) for c in done)
    appended = sum(len(c.tokens) for c in done) - generated
    return {"generated": generated, "prefilled": sum(map(len, prompts)) + appended,
            "turns": sum(c.episode for c in done)}  # fmt: skip


def run_reprefill(core: Any, cfg: MultiturnConfig, prompts: list[list[int]]) -> dict:
    """The workload with every turn a fresh request for the whole conversation."""
    from rlvr_jax.rollout import GroupRequest, Scheduler

    sched, stops = Scheduler(core), tuple(range(cfg.vocab // cfg.turn_tokens))
    convo = [list(p) for p in prompts]
    turn, generated, prefilled = [0] * len(prompts), 0, 0

    def submit(i: int) -> None:
        nonlocal prefilled
        left = cfg.budget - (len(convo[i]) - len(prompts[i]))
        sched.add(GroupRequest((i, turn[i]), i, tuple(convo[i]), 1, seed=i,
                               max_new_tokens=left, stop_token_ids=stops))  # fmt: skip
        prefilled += len(convo[i])

    for i in range(len(prompts)):
        submit(i)
    while not sched.idle:
        for request, (c,) in sched.step():
            i = request.prompt_index
            convo[i] += c.tokens
            generated += len(c.tokens)
            turn[i] += 1
            if c.finish_reason != "stop" or turn[i] >= cfg.turns:
                continue
            response = tool_response(cfg, i, turn[i])
            if len(convo[i]) + len(response) - len(prompts[i]) >= cfg.budget:
                continue  # as the in-slot side: no room left, the episode ends
            convo[i] += response
            submit(i)
    return {"generated": generated, "prefilled": prefilled, "turns": sum(turn)}


def run(sizes: Any) -> dict:
    """Both sides (the decode config's model sizes and repeats; `quick`: `QUICK`) interleaved,
    the best wall of each, and the roofline."""
    from rlvr_jax.bench.engine_timing import interleaved_best
    from rlvr_jax.bench.roofline import best_roofline
    from rlvr_jax.rollout import EngineCore

    cfg = QUICK if sizes.quick else MultiturnConfig()
    names = [f.name for f in dataclasses.fields(common.ModelSize)] + ["repeats"]
    cfg = dataclasses.replace(cfg, **{n: getattr(sizes, n) for n in names if not sizes.quick})
    arch = cfg.arch()
    model = cfg.model(cfg.seed)
    low, rng = cfg.vocab // cfg.turn_tokens, np.random.default_rng(cfg.seed)  # below: stop ids
    prompts = rng.integers(low, cfg.vocab, (cfg.episodes, cfg.prompt)).tolist()
    core = EngineCore(model, max_slots=cfg.slots, max_len=cfg.prompt + cfg.budget,
                      chunk=cfg.chunk, max_stop_ids=low)  # fmt: skip
    sides = {"in_slot": run_in_slot, "reprefill": run_reprefill}
    progress.line("multiturn workload: compiling and warming up")
    for fn in sides.values():
        fn(core, cfg, prompts[: cfg.slots])
    timed = {name: functools.partial(fn, core, cfg, prompts) for name, fn in sides.items()}
    best, counts = interleaved_best(timed, cfg.repeats)
    a, b = counts["in_slot"]["generated"], counts["reprefill"]["generated"]
    if abs(a - b) > 0.01 * max(a, b):
        raise RuntimeError(f"the two sides generated {a} and {b} tokens: not the same workload")
    tps = {k: counts[k]["generated"] / best[k] for k in sides}
    roof = best_roofline(sizes.quick)
    context = cfg.prompt + cfg.budget / 2
    work = (a + counts["in_slot"]["prefilled"]) * common.token_flops(arch, context)
    return {
        "multiturn": {
            "tokens_per_s": tps,
            "in_slot_over_reprefill": tps["in_slot"] / tps["reprefill"],
            "wall_s": best,
            "generated_tokens": {k: v["generated"] for k, v in counts.items()},
            "prefilled_tokens": {k: v["prefilled"] for k, v in counts.items()},
            "assistant_turns": {k: v["turns"] for k, v in counts.items()},
            "mean_turn_tokens": a / max(counts["in_slot"]["turns"], 1),
            "roofline_fraction": work / best["in_slot"] / (roof["peak_gflops_fp32"] * 1e9),
        },
        "roofline": roof,
        "config": {**dataclasses.asdict(cfg), "params": arch.n_params()},
    }
