"""A weight push cannot go stale silently (`rlvr_jax.rollout.push`, `rlvr_jax.training.push`):
each check broken on purpose — an out-of-order push and a partial push are refused by the actors,
a hung push stops with `PushTimeoutError`, and the probe catches actors that kept old weights."""

from __future__ import annotations

import threading
import time

import jax
import numpy as np
import pytest
from helpers_train import tiny_run

from rlvr_jax import config, losses, models, sharding
from rlvr_jax.data import load_tokenizer
from rlvr_jax.rollout import EngineCore, RolloutStream, SamplingParams
from rlvr_jax.rollout.push import (
    OutOfOrderPushError,
    PartialPushError,
    PushTimeoutError,
    StaleWeightsError,
    tree_bytes,
)
from rlvr_jax.training.context import Context
from rlvr_jax.training.metrics import read_jsonl
from rlvr_jax.training.push import WeightPusher
from rlvr_jax.training.rollouts import GeneratingSource, Rollouts

pytestmark = pytest.mark.slow  # a tiny policy and its engine, compiled (~1 min on 2 cores)


class _Source(GeneratingSource):
    """The trainer's generating source, reduced to its actors (`Rollouts` over a stream)."""

    def __init__(self, rollouts: Rollouts) -> None:
        self.rollouts = rollouts


@pytest.fixture(scope="module")
def run_config(tmp_path_factory):
    """The tiny run's config file (`helpers_train.tiny_run`)."""
    return tiny_run(tmp_path_factory.mktemp("push"))


@pytest.fixture(scope="module")
def ctx(run_config):
    """The trainer's `Context` of the tiny run (fp32; a probe tolerance of 1e-3: the fp32
    on-policy mismatch is ~1e-6, an update of this run moves log-probs by far more)."""
    cfg = config.load(run_config, ["rollout.push_probe_tolerance=0.001"])
    learner_mesh, actor_mesh = sharding.build_meshes(cfg.mesh)
    model = models.load_pretrained(cfg.model.path, mesh=learner_mesh, rules=sharding.LEARNER_RULES)
    return Context(
        cfg=cfg,
        model=model,
        tokenizer=load_tokenizer(cfg.model.path),
        learner_mesh=learner_mesh,
        actor_mesh=actor_mesh,
        settings=losses.loss_settings_from_config(cfg.loss),
        stop=lambda: False,
    )


@pytest.fixture
def actors(ctx):
    """(a started rollout stream at policy version 0, the source over it)."""
    core = EngineCore(ctx.model, max_slots=4, max_len=ctx.seq_len, chunk=4)
    stream = RolloutStream(core, max_new_tokens=8, sampling=SamplingParams(1.0)).start()
    rollouts = Rollouts(
        stream=stream, prompts=None, rewards=None, tokenizer=ctx.tokenizer, num_samples=1,
        seed=0, max_new_tokens=8,
    )  # fmt: skip
    yield stream, _Source(rollouts)
    stream.stop()


def _moved(params, scale: float, seed: int):
    """`params` + scale·N(0, 1) on every leaf (an optimizer update, larger)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: x + scale * rng.standard_normal(x.shape).astype(x.dtype), params)


def test_a_push_is_probed_and_reports_its_metrics(ctx, actors):
    stream, source = actors
    pusher = WeightPusher(ctx)
    new = _moved(ctx.model.params, 0.05, seed=1)
    metrics = pusher.push(source, new, 1)
    assert stream.version == 1
    assert metrics["push/bytes"] == tree_bytes(new) > 0
    assert metrics["push/seconds"] > 0
    # the actors sampled the probe with the pushed weights: fp32 log-probs agree
    assert 0.0 <= metrics["push/probe_max_abs_logp"] < 1e-4, metrics


def test_out_of_order_and_partial_pushes_are_refused(ctx, actors):
    stream, source = actors
    pusher = WeightPusher(ctx)
    pusher.push(source, _moved(ctx.model.params, 0.05, seed=1), 2)
    for late in (2, 1):  # a replayed or late push would roll the policy back
        with pytest.raises(OutOfOrderPushError, match=f"version {late} refused.*version 2"):
            pusher.push(source, ctx.model.params, late)
    with pytest.raises(OutOfOrderPushError):  # the scheduler's swap keeps the same contract
        stream.scheduler.set_params(stream.scheduler.params, 1)

    params = jax.tree.map(lambda x: x, ctx.model.params)  # a copy of the dicts
    del params["layers"]["mlp"]
    with pytest.raises(PartialPushError, match=r"missing: \['layers'\]\['mlp'\]"):
        pusher.push(source, params, 3)
    cut = jax.tree.map(lambda x: x, ctx.model.params)
    cut["embedding"] = cut["embedding"][:-1]  # a truncated tensor
    with pytest.raises(PartialPushError, match=r"other shapes: \['embedding'\]"):
        pusher.push(source, cut, 3)
    # nothing of the refused pushes reached the actors, which take the next whole one
    assert stream.version == 2
    metrics = pusher.push(source, _moved(ctx.model.params, 0.05, seed=3), 3)
    assert stream.version == 3 and metrics["push/probe_max_abs_logp"] < 1e-4


def test_a_hung_push_stops_with_a_named_error(ctx, actors, monkeypatch):
    stream, source = actors
    release = threading.Event()
    swap = stream.scheduler.set_params

    def hung_swap(params, version):  # e.g. a weight load in the actors that never returns
        release.wait()
        swap(params, version)

    monkeypatch.setattr(stream.scheduler, "set_params", hung_swap)
    pusher = WeightPusher(ctx)
    pusher.timeout_s = 1.0
    t0 = time.monotonic()
    try:
        with pytest.raises(PushTimeoutError, match=r"version 1 .* rollout.push_timeout_s=1 s"):
            pusher.push(source, _moved(ctx.model.params, 0.05, seed=1), 1)
        assert time.monotonic() - t0 < 10.0
    finally:
        release.set()


def test_the_probe_detects_actors_that_kept_old_weights(ctx, actors, monkeypatch):
    stream, source = actors
    scheduler = stream.scheduler

    def lost_swap(params, version):  # the version is recorded, the weights are not swapped
        del params
        scheduler.version = version

    monkeypatch.setattr(scheduler, "set_params", lost_swap)
    pusher = WeightPusher(ctx)
    with pytest.raises(StaleWeightsError, match=r"version 1.*do not hold the pushed weights"):
        pusher.push(source, _moved(ctx.model.params, 0.05, seed=1), 1)


def test_decode_chunks_are_enqueued_while_a_push_waits(ctx, actors, monkeypatch):
    # `dispatch.LOCK` is held only to enqueue: while a push waits for the actors' re-laid params
    # (here: until `gate` opens), the driver must still take the lock and enqueue decode chunks.
    stream, source = actors
    scheduler, core = stream.scheduler, stream.scheduler.core
    gate, waiting, enqueued = threading.Event(), threading.Event(), threading.Event()
    prepare, swap, generate = scheduler.prepare, scheduler.set_params, core.generate

    class Relaid:  # the re-laid params, ready once the gate opens
        def __init__(self, params):
            self.params = params

        def block_until_ready(self):
            waiting.set()
            gate.wait(120)
            return self

    def generate_and_note(*args, **kwargs):
        out = generate(*args, **kwargs)
        if waiting.is_set() and not gate.is_set():
            enqueued.set()
        return out

    monkeypatch.setattr(scheduler, "prepare", lambda params: Relaid(prepare(params)))
    monkeypatch.setattr(scheduler, "set_params", lambda relaid, v: swap(relaid.params, v))
    monkeypatch.setattr(core, "generate", generate_and_note)
    pusher = WeightPusher(ctx)
    out: dict = {}
    push = threading.Thread(target=lambda: out.update(pusher.push(source, ctx.model.params, 1)))
    push.start()
    try:
        assert waiting.wait(120), "the push never reached its wait for the re-laid params"
        stream.submit("during", [5, 6, 7], num_samples=1, seed=0)
        assert enqueued.wait(120), "no decode chunk was enqueued while the push waited"
    finally:
        gate.set()
        push.join(120)
    assert stream.get(timeout=120).request_id == "during"
    assert stream.version == 1 and out["push/probe_max_abs_logp"] < 1e-4, out


def test_the_probe_request_is_admitted_before_the_waiting_ones(ctx):
    core = EngineCore(ctx.model, max_slots=4, max_len=ctx.seq_len, chunk=4)
    one = RolloutStream(core, max_new_tokens=4, num_slots=1)  # one request at a time
    one.submit("a", [5, 6, 7], num_samples=1, seed=0, max_new_tokens=12)
    for key in ("b", "c"):
        one.submit(key, [5, 6, 7], num_samples=1, seed=0)
    assert one.step() == []  # "a" is generating, "b" and "c" wait
    probe = one.submit("probe", [5, 6], num_samples=1, seed=0, version=0, first=True, future=True)
    done = []
    while len(done) < 4:
        done += [g.request_id for g in one.step()]
        if probe.done() and "probe" not in done:
            done.append("probe")
    assert done == ["a", "probe", "b", "c"]


def test_the_trainer_stops_with_the_named_error_when_a_push_hangs(run_config, tmp_path):
    # async: the push runs on the watcher thread once step 1's update is done; the actors' move
    # of the weights never returns (e.g. a device transfer stuck in a collective)
    from rlvr_jax.training.loop import Trainer

    overrides = ["rollout.mode=async", "rollout.push_timeout_s=2", "train.max_steps=3"]
    overrides += [f"train.output_dir={tmp_path / 'out'}", "log.progress_bar=false"]
    trainer = Trainer(config.load(run_config, overrides))
    scheduler = trainer.source.rollouts.stream.scheduler
    release, prepare = threading.Event(), scheduler.prepare

    def hung_prepare(params):
        release.wait()
        return prepare(params)

    scheduler.prepare = hung_prepare
    try:
        with pytest.raises(PushTimeoutError, match=r"version 1 .* rollout.push_timeout_s=2 s"):
            trainer.run()
        t0 = time.monotonic()
        trainer.close()  # does not wait for the hung actors
        assert time.monotonic() - t0 < 30
    finally:
        release.set()
        trainer.source.close()
    steps = [r["step"] for r in read_jsonl(tmp_path / "out" / "metrics.jsonl")]
    assert steps and steps[-1] <= 2, steps
