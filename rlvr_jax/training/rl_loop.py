"""The OlmoRL loop: prompts → rollouts (actor mesh) → rewards → filtering → advantages →
jitted learner step (learner mesh) → weights back to the actors.

`rollout.mode: sync` generates exactly what a batch needs, trains, then pushes weights.
`rollout.mode: async` keeps the engine busy in its own thread with a bounded number of
requests in flight; weights are pushed after every optimizer step (in flight, KV kept) and
groups older than `rollout.max_staleness` versions are dropped and counted.

Resume is exact: each checkpoint stores the data-iterator state before the oldest request that
had not been consumed, plus the ids consumed after it, so a restart re-issues exactly the
unseen prompts; metrics.jsonl is truncated to the checkpoint's step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax import dispatch, losses, models, sharding
from rlvr_jax.config.schema import Config
from rlvr_jax.timeline import Timeline
from rlvr_jax.training import checkpoint as ckpt
from rlvr_jax.training import groups as grp
from rlvr_jax.training import learner
from rlvr_jax.training.batch import bucket_length, collate
from rlvr_jax.training.metrics import MetricsWriter, plot_curves, read_jsonl
from rlvr_jax.training.optimizer import make_optimizer
from rlvr_jax.training.run import StopFlag, ensure_model, used_devices

log = logging.getLogger("rlvr_jax.train")


class RLTrainer:
    """Owns the meshes, the policy, the engine stream, the reward service and the loop."""

    def __init__(
        self, cfg: Config, *, stop: StopFlag | None = None, timeline: Timeline | None = None
    ):
        """`timeline`: when given, records each optimizer update (with the weight push) as a
        "train" span, the rollout driver's decode chunks as "rollout" spans, and the end of
        every step as a "step" mark (`rlvr-bench e2e`)."""
        from rlvr_jax.data import load_tokenizer
        from rlvr_jax.rewards import RewardService

        self.cfg = cfg
        self.timeline = timeline
        self.stop = stop if stop is not None else StopFlag()
        self.out = Path(cfg.train.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.learner_mesh, self.actor_mesh = sharding.build_meshes(cfg.mesh, used_devices(cfg.mesh))
        path = ensure_model(cfg)
        self.model = models.load_pretrained(
            path, dtype=cfg.model.param_dtype, mesh=self.learner_mesh, rules=sharding.LEARNER_RULES
        )
        self.arch = self.model.config
        self.tokenizer = load_tokenizer(cfg.model.tokenizer or path)
        self.settings = losses.loss_settings_from_config(cfg.loss)
        self._build_data()
        self.rewards = RewardService(cfg.rewards, overlong_buffer=cfg.filter.soft_overlong_buffer)
        # a slot holds prompt + completion; the learner's shifted arrays then have exactly
        # T = max_prompt_len + max_new_tokens positions (round numbers chunk evenly)
        self.seq_len = cfg.data.max_prompt_len + cfg.rollout.max_new_tokens
        self.rows = cfg.train.prompts_per_batch * cfg.rollout.num_samples
        self._build_learner()
        self._ckpt = ckpt.Checkpointer(self.out, keep=cfg.checkpoint.keep)
        self._resume()
        self.stop_ids = self._stop_token_ids()
        self.stream = self._build_stream()

    # -- set-up (the `_build_*` / `_init_learner` hooks are where the other recipes differ) --
    def _build_data(self) -> None:
        """Loads the prompt mixture (`self.prompts`, whose state each checkpoint stores)."""
        from rlvr_jax.data import build_prompt_iterator
        from rlvr_jax.rewards import known_verifiers

        self.prompts = build_prompt_iterator(
            self.cfg.data, tokenizer=self.tokenizer, known_verifiers=known_verifiers()
        )

    def _build_stream(self) -> Any:
        """The rollout engine on the actor mesh behind a `RolloutStream` (None: no rollouts)."""
        from rlvr_jax import rollout

        cfg = self.cfg
        engine = rollout.make_engine_core(
            dataclasses.replace(self.model, params=self.state.params),
            max_slots=cfg.rollout.max_slots,
            max_len=self.seq_len,
            mesh=self.actor_mesh,
            **rollout.engine_kwargs(cfg.rollout),
        )
        engine.compile_ahead()  # before any dispatch.LOCK: a first compile never stalls
        inflight = cfg.train.prompts_per_batch * max(
            cfg.rollout.queue_size, cfg.filter.max_draws, 1
        )
        return rollout.RolloutStream(
            engine,
            max_new_tokens=cfg.rollout.max_new_tokens,
            sampling=rollout.SamplingParams(
                cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k
            ),
            stop_token_ids=self.stop_ids,
            max_pending_groups=inflight + 1,
            max_ready_groups=inflight + 1,
            version=self.version,
            timeline=self.timeline,
        )

    def _build_learner(self) -> None:
        cfg = self.cfg
        self.optimizer = make_optimizer(cfg.train)
        self.memory = learner.MemoryOptions(
            remat=cfg.train.remat,
            attn_chunk=cfg.train.attn_chunk,
            logits_chunk=cfg.train.logits_chunk,
        )
        u = cfg.train.updates_per_batch
        if self.rows % u:
            raise ValueError(
                f"train.updates_per_batch={u} must divide the batch of {self.rows} completions"
            )
        mini = self.rows // u
        mb = cfg.train.micro_batch_size or mini
        if mini % mb:
            raise ValueError(f"train.micro_batch_size={mb} must divide the mini-batch of {mini}")
        if self.settings.ratio_denominator == "sampler":
            self.old_from = "sampler"
        elif u > 1 or self.settings.tis_mode == "mask":
            self.old_from = "batch"
        else:
            self.old_from = "self"
        step = learner.make_train_step(
            self.arch,
            self.optimizer,
            self.settings,
            max_len=cfg.rollout.max_new_tokens,
            n_micro=mini // mb,
            compute_dtype=cfg.model.compute_dtype,
            temperature=cfg.rollout.temperature,
            old_from=self.old_from,
            memory=self.memory,
        )
        self._batch_rows = mini
        self._compiled_buckets: set[int] = set()  # length buckets compiled ahead
        self._init_learner(step)
        self.logprob_fn = learner.make_logprob_fn(
            self.arch,
            compute_dtype=cfg.model.compute_dtype,
            temperature=cfg.rollout.temperature,
            memory=self.memory,
        )
        self.ref_params = self.model.params if self.settings.needs_ref_logp else None

    def _init_learner(self, step: Any) -> None:
        """`self.state` (for `self.optimizer`) and `self.train_step(state, batch)`: the pure
        `step` jitted with the state donated."""
        self.state = learner.init_state(self.model.params, self.optimizer, mesh=self.learner_mesh)
        self.state_shardings = jax.tree_util.tree_map(lambda x: x.sharding, self.state)
        self.train_step = jax.jit(
            step, out_shardings=(self.state_shardings, None), donate_argnums=(0,)
        )

    def _stop_token_ids(self) -> tuple[int, ...]:
        ids = set(self.arch.eos_token_id or ())
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        for s in self.cfg.rollout.stop_strings:
            toks = self.tokenizer.encode(s, add_special_tokens=False)
            if len(toks) != 1:
                raise ValueError(f"rollout.stop_strings: {s!r} is not a single token ({toks})")
            ids.add(toks[0])
        return tuple(sorted(ids))

    # -- resume -------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    def _resume(self) -> None:
        self.start_step = 0
        self._version = 0
        self._next_request = 0
        self._skip_ids: set[int] = set()
        latest = self._ckpt.latest_step() if self.cfg.checkpoint.resume else None
        if latest is not None:
            self.state, meta = self._ckpt.restore(latest, ckpt.abstract_like(self.state))
            self.start_step = int(meta["step"])
            self._version = int(meta["version"])
            self.prompts.restore(meta["data"])
            self._next_request = int(meta["next_request"])
            self._skip_ids = set(meta["consumed_after"])
            self._restore_extra(meta)
            log.info("resumed from checkpoint %d (policy version %d)", latest, self._version)
        self.metrics = MetricsWriter(
            self.out, tensorboard=self.cfg.log.tensorboard, resume_step=self.start_step
        )
        self._snapshots: dict[int, dict] = {}
        self._inflight: dict[int, Any] = {}
        self._consumed: set[int] = set()

    def _checkpoint(self, step: int) -> None:
        oldest = min(self._inflight) if self._inflight else self._next_request
        data_state = self._snapshots.get(oldest, self.prompts.state())
        meta = {
            "step": step,
            "version": self._version,
            "data": data_state,
            "next_request": oldest,
            "consumed_after": sorted(i for i in self._consumed if i > oldest),
            **self._extra_meta(),
        }
        self._ckpt.save(step, self.state, meta)

    def _extra_meta(self) -> dict[str, Any]:
        """More JSON for the checkpoint's side-car (a recipe's second data stream)."""
        return {}

    def _restore_extra(self, meta: dict[str, Any]) -> None:
        """Restores what `_extra_meta` saved."""

    # -- rollouts -----------------------------------------------------------------------
    def _submit_one(self) -> None:
        from rlvr_jax.data import format_prompt

        while True:
            rid = self._next_request
            self._snapshots[rid] = self.prompts.state()
            row = self.prompts.next_batch(1)[0]
            self._next_request += 1
            if rid in self._skip_ids:  # consumed before the restart
                self._skip_ids.discard(rid)
                self._snapshots.pop(rid)
                continue
            tokens = format_prompt(row, self.tokenizer, self.cfg.data.prompt_template)
            self._inflight[rid] = (row, tokens)
            self.stream.submit(
                rid,
                tokens,
                num_samples=self.cfg.rollout.num_samples,
                seed=self.cfg.seed * 1_000_003 + rid,
            )
            return

    def _fill(self, target: int) -> None:
        while len(self._inflight) < target:
            self._submit_one()

    def _collect(self, step: int) -> tuple[grp.BatchAssembler, dict[str, float]]:
        cfg = self.cfg
        P = cfg.train.prompts_per_batch
        asm = grp.BatchAssembler(
            P,
            zero_variance_filter=cfg.filter.zero_variance,
            max_staleness=cfg.rollout.max_staleness if cfg.rollout.mode == "async" else None,
        )
        cap = P * max(cfg.filter.max_draws, 1) if cfg.filter.active_sampling else P
        reward_metrics: dict[str, list[float]] = {}
        async_mode = cfg.rollout.mode == "async"
        while not asm.full and asm.drawn < cap and not self.stop:
            if async_mode:
                self._fill(self._async_target())
            else:
                self._fill(min(P - len(asm.kept), cap - asm.drawn))
            done = [self.stream.get()]
            while self.stream.ready:
                done.append(self.stream.get())
            triples = [self._take(g) for g in done]
            scored, m = grp.score_groups(
                triples, self.rewards, self.tokenizer, max_len=cfg.rollout.max_new_tokens
            )
            for k, v in m.items():
                reward_metrics.setdefault(k, []).append(v)
            for g in scored:
                asm.offer(g, self._version)
        self._last_groups = asm.kept
        return asm, {k: float(np.mean(v)) for k, v in reward_metrics.items()}

    def _async_target(self) -> int:
        """Requests kept in flight in async mode: `rollout.queue_size` batches."""
        return self.cfg.train.prompts_per_batch * max(self.cfg.rollout.queue_size, 1)

    def _take(self, group: Any) -> tuple[Any, list[int], list[Any]]:
        """(row, prompt tokens, completions) of a completed group, marked as consumed."""
        row, tokens = self._inflight.pop(group.request_id)
        self._snapshots.pop(group.request_id, None)
        self._consumed.add(group.request_id)
        return row, tokens, group.completions

    # -- learning -----------------------------------------------------------------------
    def _train(self, asm: grp.BatchAssembler) -> list[dict[str, jax.Array]]:
        samples, rewards_PxG = grp.build_samples(
            asm.kept, overlong_filter=self.cfg.filter.overlong_filter
        )
        T = self._batch_length(asm.kept)
        arrays = collate(samples, rows=self.rows, seq_len=T + 1, pad_id=self._pad_id())
        batch = {
            k: jax.device_put(
                v, sharding.batch_sharding(self.learner_mesh, sharding.LEARNER_RULES, v.shape)
            )
            for k, v in arrays.items()
        }
        if self.old_from == "batch" or self.settings.reward_kl_coef > 0:
            batch["old_logp"] = self.logprob_fn(self.state.params, batch)
        if self.ref_params is not None:
            batch["ref_logp"] = self.logprob_fn(self.ref_params, batch)
        batch["advantages"] = self._advantages(batch, jnp.asarray(rewards_PxG))
        if self.cfg.train.save_batch:
            self._save_batch(batch, rewards_PxG)
        out = []
        n = self._batch_rows
        for u in range(self.cfg.train.updates_per_batch):
            mini = {k: v[u * n : (u + 1) * n] for k, v in batch.items()}
            self.state, metrics = self.train_step(self.state, mini)
            out.append(metrics)
        return out

    def _batch_length(self, groups: list[grp.ScoredGroup]) -> int:
        """Learner positions T of a batch of `groups`: its longest prompt + completion rounded
        up to a length bucket (`train.bucket_min_len`)."""
        longest = max(
            (len(g.prompt_tokens) + len(c.tokens) for g in groups for c in g.completions),
            default=1,
        )
        return bucket_length(
            longest,
            full=self.seq_len,
            min_len=self.cfg.train.bucket_min_len,
            multiple=math.lcm(self.cfg.train.attn_chunk or 1, self.cfg.train.logits_chunk or 1),
        )

    def _compile_ahead(self, groups: list[grp.ScoredGroup]) -> None:
        """Compiles the train step for this batch's length bucket before `dispatch.LOCK` is
        taken: a compile under the lock would stall the rollout thread for all its duration.
        JAX caches the executable, so the call under the lock finds it; a no-op once a bucket
        is compiled, and harmless if the call's signature differs (it then compiles there)."""
        lower = getattr(self.train_step, "lower", None)
        if lower is None or not groups:
            return
        T = self._batch_length(groups)
        if T in self._compiled_buckets:
            return
        # the mini-batch `_train` will pass: collate's arrays (an empty batch has their shapes
        # and dtypes) plus the log-probs it adds
        empty = collate([], rows=self._batch_rows, seq_len=T + 1, pad_id=0)
        if self.old_from == "batch" or self.settings.reward_kl_coef > 0:
            empty["old_logp"] = empty["sampler_logp"]
        if self.ref_params is not None:
            empty["ref_logp"] = empty["sampler_logp"]
        mesh, rules = self.learner_mesh, sharding.LEARNER_RULES
        mini = {
            k: jax.ShapeDtypeStruct(
                v.shape, v.dtype, sharding=sharding.batch_sharding(mesh, rules, v.shape)
            )
            for k, v in empty.items()
        }
        lower(self.state, mini).compile()
        self._compiled_buckets.add(T)

    def _advantages(self, batch: dict[str, jax.Array], rewards_PxG: jax.Array) -> jax.Array:
        """Advantages of the real rows (KL-penalised rewards when `loss.kl_mode: reward`),
        zero on the padding rows of an under-filled batch."""
        P, G = rewards_PxG.shape
        if self.settings.reward_kl_coef > 0:
            rewards_B = losses.kl_reward_penalty(
                rewards_PxG.reshape(-1),
                logp=batch["old_logp"][: P * G],
                ref_logp=batch["ref_logp"][: P * G],
                mask=batch["mask"][: P * G],
                kl_coef=self.settings.reward_kl_coef,
                kl_estimator=self.settings.kl_estimator,
            )
            rewards_PxG = rewards_B.reshape(P, G)
        adv_B = losses.advantages(self.settings.advantage, rewards_PxG).reshape(-1)
        adv_B = jnp.zeros((self.rows,), jnp.float32).at[: P * G].set(adv_B)
        return jax.device_put(
            adv_B, sharding.batch_sharding(self.learner_mesh, sharding.LEARNER_RULES, adv_B.shape)
        )

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else (self.arch.pad_token_id or 0))

    def _save_batch(self, batch: dict[str, jax.Array], rewards_PxG: np.ndarray) -> None:
        from rlvr_jax.bench.losses import save_batch

        old = batch.get("old_logp")
        if old is None:
            old = self.logprob_fn(self.state.params, batch)
        extra = {"ref_logp": np.asarray(batch["ref_logp"])} if "ref_logp" in batch else {}
        save_batch(
            self.cfg.train.save_batch,
            logp=np.asarray(old),
            old_logp=np.asarray(old),
            sampler_logp=np.asarray(batch["sampler_logp"]),
            advantages=np.asarray(batch["advantages"]),
            mask=np.asarray(batch["mask"]),
            rewards=np.pad(rewards_PxG.reshape(-1), (0, self.rows - rewards_PxG.size)),
            group_size=np.asarray(self.cfg.rollout.num_samples),
            max_len=np.asarray(self.cfg.rollout.max_new_tokens),
            **extra,
        )
        log.info("saved a training batch to %s", self.cfg.train.save_batch)

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> None:
        cfg = self.cfg
        self.stream.start()
        pending: tuple[int, dict, list] | None = None
        bar = _progress(cfg, self.start_step)
        step = self.start_step
        try:
            for step in range(self.start_step + 1, cfg.train.max_steps + 1):
                if self.stop:
                    step -= 1
                    break
                t0 = time.perf_counter()
                asm, reward_metrics = self._collect(step)
                t_rollout = time.perf_counter() - t0
                staleness = _staleness(asm.kept, self._version)
                if pending is not None:  # fetch the previous step's device metrics now
                    self._write_metrics(*pending)
                if cfg.rollout.mode == "async" and not self.stop:
                    # top the queue up now, so that the actors generate the next batch while
                    # the learner trains on this one (not after the metrics and scoring)
                    self._fill(self._async_target())
                t1 = time.perf_counter()
                with self._span("train"):
                    device_metrics = self._update(asm)
                t_train = time.perf_counter() - t1
                host = {**asm.metrics(), **reward_metrics}
                host["time/rollout_s"] = t_rollout
                host["time/train_s"] = t_train
                tokens = sum(len(c.tokens) for g in asm.kept for c in g.completions)
                host["throughput/tokens"] = tokens
                host["throughput/tokens_per_s"] = tokens / max(t_rollout + t_train, 1e-9)
                host["staleness/mean"] = staleness
                pending = (step, host, device_metrics)
                self._maybe_eval_and_checkpoint(step, pending)
                if self.timeline is not None:
                    self.timeline.mark("step")
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(reward=f"{host.get('reward/mean', float('nan')):.3f}")
        finally:
            if pending is not None:
                self._write_metrics(*pending)
            if bar is not None:
                bar.close()
        self._finish(step)

    def _update(self, asm: grp.BatchAssembler) -> list[dict[str, jax.Array]]:
        """The optimizer update(s) on a collected batch, then the weight push to the actors
        (which keep decoding meanwhile); the device metrics, not yet fetched."""
        self._compile_ahead(asm.kept)  # outside the lock: the actors keep decoding
        with dispatch.LOCK:  # enqueue the whole update (see rlvr_jax.dispatch)
            device_metrics = self._train(asm) if asm.kept else []
        self._version = int(jax.device_get(self.state.step))
        with dispatch.LOCK:
            self.stream.update_weights(self.state.params, self._version)
        return device_metrics

    def _span(self, name: str) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if self.timeline is None else self.timeline.span(name)

    def _maybe_eval_and_checkpoint(self, step: int, pending) -> None:
        cfg = self.cfg
        if cfg.eval.every_steps and step % cfg.eval.every_steps == 0:
            pending[1].update(self.evaluate())
        if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
            self._write_metrics(*pending)  # metrics up to `step` land before its checkpoint
            self._checkpoint(step)

    def _write_metrics(self, step: int, host: dict, device: list) -> None:
        if not host and not device:
            return
        fetched = jax.device_get(device)
        row = dict(host)
        for k in fetched[0] if fetched else {}:
            row[k] = float(np.mean([m[k] for m in fetched]))
        row["policy_version"] = self._version
        if "tis/mean" not in row and "tis_weight/mean" in row:
            row["tis/mean"] = row["tis_weight/mean"]
        self.metrics.write(step, row)
        for i, g in enumerate(getattr(self, "_last_groups", [])[: self.cfg.log.sample_completions]):
            if g.texts:
                self.metrics.text(step, f"samples/{i}", g.texts[0])
        host.clear()
        device.clear()

    def evaluate(self) -> dict[str, float]:
        """Held-out pass@k with the current policy (keys `eval/pass@k`, `eval/<domain>/pass@k`)."""
        from rlvr_jax.eval.evaluate import evaluate_policy

        model = dataclasses.replace(self.model, params=self.state.params)
        return evaluate_policy(
            model, self.tokenizer, self.cfg, reward_service=self.rewards, prefix="eval/"
        )

    def _finish(self, step: int) -> None:
        self.steps_done = step
        self._checkpoint(step)
        self._ckpt.wait()
        cfg = self.cfg
        if cfg.log.plots:
            plot_curves(read_jsonl(self.metrics.path), self.out / "curves.png")
        if cfg.checkpoint.export_hf and not self.stop and jax.process_index() == 0:
            final = dataclasses.replace(self.model, params=self.state.params)
            models.save_pretrained(final, self.out / "final")
            log.info("exported the final policy to %s", self.out / "final")

    def close(self) -> None:
        closers = [self.rewards.close, self._ckpt.close, self.metrics.close]
        if self.stream is not None:
            closers.insert(0, self.stream.stop)
        for closer in closers:
            try:
                closer()
            except Exception:  # keep closing the rest
                log.exception("while closing")


def _staleness(groups: list[grp.ScoredGroup], version: int) -> float:
    if not groups:
        return 0.0
    return float(np.mean([version - g.version for g in groups]))


def _progress(cfg: Config, start: int):
    if not cfg.log.progress_bar:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.train.max_steps, initial=start, desc="rl", unit="step")
