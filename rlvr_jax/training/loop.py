"""The training loop, one for every algorithm (`algorithms.ALGORITHMS` gives the source and
the update).

Each step: the source's next batch (host work), its settled prompts to the ledger, compiles
outside the dispatch lock, the update dispatched (the device trains while the host goes on),
step N−1's metrics written (fetched now: step N is queued), the new weights pushed to the actors
(`training.push`), a checkpoint `{train state, source.state(), ledger count}` every
`checkpoint.every_steps`, an evaluation every `eval.every_steps`, a stop on SIGINT/SIGTERM. The
policy version (updates dispatched) is counted on the host: no device sync per step.

Weights are pushed right after the dispatch when the source is on-policy (sync, expert
iteration), else once the update has completed (async: the actors decode with the previous
weights meanwhile and swap at a chunk boundary, KV cache kept). With LoRA only the adapters
train, are pushed and are checkpointed; the final export is the merged HF checkpoint plus a
PEFT adapter directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from rlvr_jax import dispatch, losses, models, sharding
from rlvr_jax.config.checks import check, check_context
from rlvr_jax.config.schema import Config
from rlvr_jax.models import lora
from rlvr_jax.models.bootstrap import ensure_model
from rlvr_jax.rollout.push import PushTimeoutError
from rlvr_jax.shutdown import SignalStop
from rlvr_jax.timeline import Timeline
from rlvr_jax.training import checkpoint as ckpt
from rlvr_jax.training.algorithms import get_algorithm
from rlvr_jax.training.context import Context
from rlvr_jax.training.export import write_run_config
from rlvr_jax.training.ledger import Ledger
from rlvr_jax.training.metrics import MetricsWriter, plot_curves, read_jsonl
from rlvr_jax.training.push import WeightPusher
from rlvr_jax.training.step_log import EmptySteps

if TYPE_CHECKING:
    from rlvr_jax.rollout import Rollout

log = logging.getLogger("rlvr_jax.train")


@dataclasses.dataclass
class _Pending:
    """A dispatched step whose metrics are not written yet."""

    step: int
    host: dict[str, Any]
    device: list[Any]
    samples: list[dict[str, Any]]
    dispatched: float
    tokens: int
    version: int
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    finished: float = 0.0
    written: bool = False


class Trainer:
    """Builds what `cfg.algorithm` runs, resumes from the newest intact checkpoint, runs."""

    def __init__(
        self, cfg: Config, *, stop: SignalStop | None = None, timeline: Timeline | None = None
    ):
        """`stop`: set (SIGINT/SIGTERM) to end the run after this step, checkpointed. `timeline`
        (`rlvr-bench e2e`): records each update as a "train" span, the decode chunks as
        "rollout" spans and each step's end as a "step" mark."""
        from rlvr_jax.data import load_tokenizer

        check(cfg)  # a Config built in Python, not loaded, is checked too: before anything is built
        _compilation_cache(cfg.train.compilation_cache_dir)
        self.cfg, self.timeline = cfg, timeline
        self.stop = stop if stop is not None else SignalStop("rlvr-train", grace_s=None)
        self.dispatched = 0
        """The last step dispatched (named when a signal comes)."""
        self.stop.status = lambda n: (
            f"signal {n} at step {self.dispatched}: finishing the step, then checkpointing"
        )
        self.out = Path(cfg.train.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        if jax.process_index() == 0:  # what rlvr-export / rlvr-eval read to load a checkpoint
            write_run_config(cfg, self.out)
        self.algorithm = get_algorithm(cfg.algorithm)
        learner_mesh, actor_mesh = sharding.build_meshes(cfg.mesh)
        path = ensure_model(cfg)
        check_context(cfg)  # again: `model.create_if_missing` may have just built the model
        model = models.load_pretrained(
            path, dtype=cfg.model.param_dtype, mesh=learner_mesh, rules=sharding.LEARNER_RULES
        )
        model = models.adapt_lora(model, cfg.model.lora, seed=cfg.seed)
        self.ctx = Context(
            cfg=cfg,
            model=model,
            tokenizer=load_tokenizer(cfg.model.tokenizer or path),
            learner_mesh=learner_mesh,
            actor_mesh=actor_mesh,
            settings=losses.loss_settings_from_config(cfg.loss),
            stop=self.stop.event.is_set,
            timeline=timeline,
            turns=_device_turns(cfg),
        )
        self.update = self.algorithm.update(self.ctx)
        self.state = self.update.init_state(model.params)
        self.checkpointer = ckpt.Checkpointer(
            self.out, keep=cfg.checkpoint.keep, verify=cfg.checkpoint.verify
        )
        self.start_step, self.version, source_state, settled = 0, 0, None, None
        if cfg.checkpoint.resume:
            restored = self.checkpointer.restore_latest(ckpt.abstract_like(_saved(self.state)))
            if restored is not None:
                step, saved, meta = restored
                frozen = lora.split(self.state.params)[1]  # the LoRA base (None without)
                self.state = saved.replace(params=lora.combine(saved.params, frozen))
                self.start_step, self.version = int(meta["step"]), int(meta["version"])
                source_state, settled = meta["source"], meta.get("ledger")
                log.info("resumed from checkpoint %d (policy version %d)", step, self.version)
        self.steps_done = self.start_step
        self.source = self.algorithm.source(self.ctx, self.state.params, self.version)
        if source_state is not None:
            self.source.restore(source_state)
        self.metrics = MetricsWriter(
            self.out,
            tensorboard=cfg.log.tensorboard,
            resume_step=self.start_step,
            enabled=jax.process_index() == 0,  # one process writes the run's files
        )
        self.ledger = Ledger(
            self.out,
            resume_step=self.start_step,
            expected=settled,
            enabled=jax.process_index() == 0,
        )
        self.pusher = WeightPusher(self.ctx)
        self._pusher: threading.Thread | None = None
        self._push_error: BaseException | None = None  # of the watcher thread's push
        self._hung = False  # a push timed out: the actors may never answer again
        self._bar: Any = None
        self.empty_steps = EmptySteps()
        self._saved: int | None = None
        self._eval_rollout: Rollout | None = None

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> None:
        cfg = self.cfg
        self.source.start()
        pending: _Pending | None = None
        bar = self._bar = _progress(cfg, self.start_step)
        step = self.start_step
        try:
            while step < cfg.train.max_steps and not self.stop.event.is_set():
                batch = self.source.next(self.version)
                if batch is None:  # stopped while collecting: nothing was consumed
                    break
                step += 1
                self.ledger.write(step, batch.settled)  # before step's checkpoint can be
                current = self._dispatch(step, batch)
                self.dispatched = step
                self.empty_steps.record(step, batch.arrays is not None, batch.empty_reason)
                if pending is not None:
                    self._write(pending)
                pending = current
                if self.source.on_policy:  # sync: the next rollouts need this step's weights;
                    current.done.wait()  # waiting here keeps the timeline's stages disjoint
                self._maybe_eval_and_checkpoint(step, pending)
                if self.timeline is not None:
                    self.timeline.mark("step")
                if bar is not None:
                    bar.update(1)
        finally:
            if pending is not None:
                self._write(pending)
            if bar is not None:
                bar.close()
        self._finish(step)

    def _dispatch(self, step: int, batch: Any) -> _Pending:
        """Compiles, dispatches the update (under the lock), sends the weights; returns metrics."""
        self._wait_push()  # the previous weights are on their way: the state may be donated
        self.update.compile(self.state, batch)
        turns = self.ctx.turns  # shared devices, async: the update runs alone (`_watch` ends it)
        if turns is not None:
            turns.acquire("learner")
        t0 = time.perf_counter()
        try:
            with dispatch.LOCK:
                self.state, device, n = self.update.update(self.state, batch)
        except BaseException:
            if turns is not None:
                turns.release()
            raise
        self.version += n
        pending = _Pending(
            step, dict(batch.metrics), device, batch.samples, t0, batch.tokens, self.version
        )
        watched = (self.state.params, device) if n else device
        if n and self.source.on_policy:  # watched first: the train span ends with the update
            self._watch(pending, watched, push=None)
            self._push(self.state.params, self.version, pending)
        else:
            self._watch(pending, watched, push=(self.state.params, self.version) if n else None)
        return pending

    def _watch(self, pending: _Pending, arrays: Any, push: tuple[Any, int] | None) -> None:
        """A thread that waits for the step's results, times them, and pushes when asked."""

        def wait() -> None:
            try:
                try:
                    jax.block_until_ready(arrays)
                finally:
                    if self.ctx.turns is not None:
                        self.ctx.turns.release()
                pending.finished = time.perf_counter()
                if self.timeline is not None:
                    self.timeline.add("train", pending.dispatched, pending.finished)
                if push is not None:
                    self._push(*push, pending)
            except BaseException as e:  # raised on the loop's thread by `_wait_push`
                self._push_error = e
                self.stop.event.set()
            finally:
                pending.done.set()

        self._pusher = threading.Thread(target=wait, name=f"step-{pending.step}", daemon=True)
        self._pusher.start()

    def _push(self, params: Any, version: int, pending: _Pending) -> None:
        """Pushes and probes (`WeightPusher`); the `push/*` metrics join the step's row."""
        try:
            pending.host.update(self.pusher.push(self.source, params, version, _pushed(params)))
        except PushTimeoutError:
            self._hung = True
            raise

    def _wait_push(self) -> None:
        """Joins the watcher thread; raises the error of its push."""
        if self._pusher is not None:
            self._pusher.join()
            self._pusher = None
        if self._push_error is not None:
            error, self._push_error = self._push_error, None
            raise error

    def _write(self, p: _Pending) -> None:
        """Fetches the step's device metrics and writes its row (once)."""
        if p.written:
            return
        p.written = True
        p.done.wait()
        fetched = jax.device_get(p.device)
        row = dict(p.host)
        for k in fetched[0] if fetched else {}:
            row[k] = float(np.mean([m[k] for m in fetched]))
        train_s = max(p.finished - p.dispatched, 0.0)
        row["time/train_s"] = train_s
        row["throughput/tokens"] = p.tokens
        busy_s = row.get("time/rollout_s", row.get("time/data_s", 0.0)) + train_s
        row["throughput/tokens_per_s"] = p.tokens / max(busy_s, 1e-9)
        row["policy_version"] = p.version
        if "tis/mean" not in row and "tis_weight/mean" in row:
            row["tis/mean"] = row["tis_weight/mean"]
        self.metrics.write(p.step, row)
        for i, sample in enumerate(p.samples[: self.cfg.log.sample_completions]):
            self.metrics.sample(p.step, i, sample)
        if self._bar is not None:
            self._bar.set_postfix(_postfix(row), refresh=False)

    def _maybe_eval_and_checkpoint(self, step: int, pending: _Pending) -> None:
        cfg = self.cfg
        if cfg.eval.every_steps and step % cfg.eval.every_steps == 0:
            pending.host.update(self.evaluate())
        if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
            self._write(pending)  # metrics up to `step` land before its checkpoint
            self._checkpoint(step)

    def _checkpoint(self, step: int) -> None:
        meta = {"step": step, "version": self.version, "source": self.source.state()}
        meta["ledger"] = self.ledger.count  # the ledger's records of steps <= step
        self.checkpointer.save(step, _saved(self.state), meta)
        self._saved = step

    def evaluate(self) -> dict[str, float]:
        """Held-out pass@k of the current policy (`eval/pass@k`, `eval/<domain>/pass@k`), sampled
        by the run's actor rollout with every request pinned to the current policy version."""
        from rlvr_jax.eval.evaluate import evaluate_rollout
        from rlvr_jax.rewards import RewardService

        self._wait_push()  # async: this version is pushed once its update has completed
        rollouts = self.source.rollouts
        rollout = rollouts.stream if rollouts is not None else self._evaluation_rollout()
        rewards = rollouts.rewards if rollouts is not None else None
        with contextlib.ExitStack() as stack:
            if rewards is None:
                rewards = stack.enter_context(RewardService(self.cfg.rewards))
            return evaluate_rollout(
                rollout,
                self.ctx.tokenizer,
                self.cfg,
                reward_service=rewards,
                prefix="eval/",
                version=self.version,
            )

    def _evaluation_rollout(self) -> Rollout:
        """The evaluations' actor rollout for an algorithm that samples nothing (sft, dpo)."""
        if self._eval_rollout is None:
            self._eval_rollout = self.ctx.actor_rollout(self.state.params, self.version)
            if jax.process_count() == 1:
                self._eval_rollout.start()
        elif self._eval_rollout.version != self.version:
            self._eval_rollout.update_weights(_pushed(self.state.params), self.version)
        return self._eval_rollout

    def _finish(self, step: int) -> None:
        self.steps_done = step
        self._wait_push()
        if self._saved != step:
            self._checkpoint(step)
        self.checkpointer.wait()
        self.ledger.write(step, self.source.pending())  # dropped again on resume
        if self.stop.signum is not None:
            log.warning("stopped at step %d, checkpoint written; rerun to resume", step)
        cfg = self.cfg
        if cfg.log.plots and self.metrics.enabled:
            plot_curves(read_jsonl(self.metrics.path), self.out / "curves.png")
        if cfg.checkpoint.export_hf and not self.stop.event.is_set():
            params = self.state.params
            if jax.process_count() > 1:  # every process takes part in the gather
                from jax.experimental import multihost_utils

                params = multihost_utils.process_allgather(params, tiled=True)
            final = dataclasses.replace(self.ctx.model, params=params)
            if lora.has_adapters(params):
                from rlvr_jax.models.peft_io import save_lora_exports

                save_lora_exports(final, self.out / "final", self.out / "final_adapter")
                log.info("exported the merged policy to %s and its PEFT adapter to %s",
                         self.out / "final", self.out / "final_adapter")  # fmt: skip
            elif jax.process_index() == 0:
                models.save_pretrained(final, self.out / "final")
                log.info("exported the final policy to %s", self.out / "final")

    def close(self) -> None:
        if self._pusher is not None:
            self._pusher.join()  # bounded by rollout.push_timeout_s
        closers = [
            self.source.close,
            self.checkpointer.close,
            self.metrics.close,
            self.ledger.close,
        ]
        if self._hung:  # a push timed out: the actors' threads may never answer
            log.error("a weight push timed out: not waiting for the actors to stop")
            closers.remove(self.source.close)
        if self._eval_rollout is not None:
            closers.append(self._eval_rollout.close)
        for closer in closers:
            try:
                closer()
            except Exception:  # keep closing the rest
                log.exception("while closing")


def _saved(state: Any) -> Any:
    """The train state a checkpoint holds: with LoRA, without the frozen base (reloaded)."""
    return state.replace(params=lora.split(state.params)[0])


def _pushed(params: Any) -> Any:
    """What a weight push moves: the adapters alone with LoRA (the actors hold the base)."""
    return lora.split(params)[0]


def _compilation_cache(path: str | None) -> None:
    """Turns on JAX's persistent compilation cache at `path` unless it is off or already on."""
    if not path or jax.config.jax_compilation_cache_dir:
        return
    jax.config.update("jax_compilation_cache_dir", str(Path(path).expanduser()))


def _device_turns(cfg: Config) -> dispatch.DeviceTurns | None:
    """Turns on the devices when actors and learner share them in async mode, in one process."""
    shared = cfg.mesh.actor_devices == 0 and cfg.rollout.mode == "async"
    return dispatch.DeviceTurns() if shared and jax.process_count() == 1 else None


def _postfix(row: dict[str, Any]) -> dict[str, str]:
    """The progress bar's figure of a step: its mean reward, else its loss, else nothing."""
    for key, name in (("reward/mean", "reward"), ("loss", "loss")):
        value = row.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            return {name: f"{value:.3f}"}
    return {}


def _progress(cfg: Config, start: int):
    if not cfg.log.progress_bar:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.train.max_steps, initial=start, desc=cfg.algorithm, unit="step")
