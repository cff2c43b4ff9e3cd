"""The recipes besides RL that `rlvr-train` runs (`algorithm: sft | expert_iteration |
rl_sft_parallel`), each an `RLTrainer` with its own data, learner step and (for SFT) loop, so
that metrics.jsonl / TensorBoard, checkpoints with exact resume, in-loop evaluation and the HF
export behave exactly as in RL. What differs is in `RLTrainer`'s hooks: `_build_data`,
`_build_learner` / `_init_learner`, `_build_stream`, `_collect`, `_train`, `_extra_meta` /
`_restore_extra`.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from rlvr_jax import dispatch, sharding
from rlvr_jax.config.schema import Config
from rlvr_jax.training import groups as grp
from rlvr_jax.training.optimizer import make_optimizer
from rlvr_jax.training.recipes.expert import expert_examples, expert_metrics, score_verified
from rlvr_jax.training.recipes.parallel import (
    ParallelState,
    init_parallel_state,
    make_parallel_step,
)
from rlvr_jax.training.recipes.sft_data import SFTBatcher, build_sft_iterator
from rlvr_jax.training.rl_loop import RLTrainer
from rlvr_jax.training.run import StopFlag
from rlvr_jax.training.sft import collate_sft, make_sft_step

PARALLEL_SFT_SEED_OFFSET = 1
"""`rl_sft_parallel` draws SFT examples with seed `data.seed + 1`, so that when both halves use
the same sources they do not see the same prompts in lockstep."""


def to_learner(mesh: Any, arrays: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """Host batch arrays on the learner mesh, rows split by the `batch` rule."""
    return {
        k: jax.device_put(v, sharding.batch_sharding(mesh, sharding.LEARNER_RULES, v.shape))
        for k, v in arrays.items()
    }


def micro_batches(rows: int, micro_batch_size: int, what: str) -> int:
    """Micro-batches per step of `rows` rows under `train.micro_batch_size` (0 = one)."""
    if rows < 1:
        raise ValueError(f"{what} must be >= 1 rows, got {rows}")
    mb = micro_batch_size or rows
    if rows % mb:
        raise ValueError(f"train.micro_batch_size={mb} must divide the {what} of {rows} rows")
    return rows // mb


def progress_bar(cfg: Config, start: int) -> Any:
    """A tqdm bar over the run's steps (None when `log.progress_bar` is off)."""
    if not cfg.log.progress_bar:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.train.max_steps, initial=start, desc=cfg.algorithm, unit="step")


class _SFTLearning(RLTrainer):
    """A trainer whose optimizer steps are SFT steps (`sft.make_sft_step`, AdamW of `train.*`)."""

    def _build_sft_learner(self, rows: int) -> None:
        cfg = self.cfg
        n_micro = micro_batches(rows, cfg.train.micro_batch_size, "SFT batch")
        self.optimizer = make_optimizer(cfg.train)
        step = make_sft_step(
            self.arch, self.optimizer, compute_dtype=cfg.model.compute_dtype, n_micro=n_micro
        )
        self._init_learner(step)


class SFTTrainer(_SFTLearning):
    """`algorithm: sft`: next-token loss on the responses of SFT examples (`sft_data`), one
    optimizer step of `sft.batch_size` examples per step, no rollout engine.

    The loop dispatches step N, then fetches step N−1's metrics (the host lays out the next
    batch while the device trains). Extra metrics: `sft/token_accuracy`, `sft/tokens` (response
    tokens trained on), `time/data_s`, `time/train_s` (from dispatching a step, compilation
    included, until its completion is observed) and `throughput/tokens_per_s` (response
    tokens per `time/train_s`).
    """

    def __init__(self, cfg: Config, *, stop: StopFlag | None = None):
        if cfg.sft.batch_size < 1:
            raise ValueError(f"sft.batch_size must be >= 1, got {cfg.sft.batch_size}")
        super().__init__(cfg, stop=stop)

    def _build_data(self) -> None:
        self.prompts = build_sft_iterator(self.cfg, self.tokenizer, seed=self.cfg.data.seed)

    def _build_learner(self) -> None:
        cfg = self.cfg
        self.rows = cfg.sft.batch_size
        self._build_sft_learner(self.rows)
        self.batcher = SFTBatcher(
            self.prompts,
            self.tokenizer,
            cfg.data.prompt_template,
            rows=self.rows,
            seq_len=self.seq_len + 1,
            pad_id=self._pad_id(),
        )
        self._dispatched: dict[int, tuple[float, float]] = {}

    def _build_stream(self) -> None:
        return None

    def run(self) -> None:
        cfg = self.cfg
        pending: tuple[int, dict, list] | None = None
        bar = progress_bar(cfg, self.start_step)
        step = self.start_step
        try:
            for step in range(self.start_step + 1, cfg.train.max_steps + 1):
                if self.stop:
                    step -= 1
                    break
                t0 = time.perf_counter()
                arrays = self.batcher.next_arrays()
                batch = to_learner(self.learner_mesh, arrays)
                host = {"time/data_s": time.perf_counter() - t0}
                if pending is not None:  # waits for step N−1 only
                    self._write_metrics(*pending)
                self._dispatched[step] = (time.perf_counter(), float(arrays["mask"].sum()))
                with dispatch.LOCK:
                    self.state, device_metrics = self.train_step(self.state, batch)
                pending = (step, host, [device_metrics])
                self._maybe_eval_and_checkpoint(step, pending)
                if bar is not None:
                    bar.update(1)
        finally:
            if pending is not None:
                self._write_metrics(*pending)
            if bar is not None:
                bar.close()
        self._finish(step)

    def _write_metrics(self, step: int, host: dict, device: list) -> None:
        """Waits for the step, records its timing and the policy version, then writes."""
        if device:
            jax.block_until_ready(device)
            self._version = int(jax.device_get(self.state.step))
            dispatched, tokens = self._dispatched.pop(step)
            host["time/train_s"] = time.perf_counter() - dispatched
            host["throughput/tokens_per_s"] = tokens / max(host["time/train_s"], 1e-9)
        super()._write_metrics(step, host, device)


class ExpertIterationTrainer(_SFTLearning):
    """`algorithm: expert_iteration`: each step is one round — sample `rollout.num_samples`
    completions of each of `train.prompts_per_batch` prompts from the current policy, verify
    them, keep those whose verifier score is at least `sft.expert_min_score` (`expert`), and
    take `sft.expert_sft_steps` SFT optimizer steps on them (one batch of prompts × samples
    rows; rows not filled are masked). Rounds are on-policy: a round's prompts are issued after
    the previous round's update reached the engine (`rollout.mode` does not apply), and no
    group is filtered. A round that keeps nothing makes no update. Extra metrics: `expert/*`.
    """

    def __init__(self, cfg: Config, *, stop: StopFlag | None = None):
        sft = cfg.sft
        if not 0.0 < sft.expert_min_score <= 1.0:
            raise ValueError(
                f"sft.expert_min_score must be in (0, 1] (verifier scores are in [0, 1]; <= 0 "
                f"would keep unverified samples), got {sft.expert_min_score}"
            )
        if sft.expert_sft_steps < 1:
            raise ValueError(f"sft.expert_sft_steps must be >= 1, got {sft.expert_sft_steps}")
        super().__init__(cfg, stop=stop)

    def _build_learner(self) -> None:
        self._build_sft_learner(self.rows)

    def _collect(self, step: int) -> tuple[grp.BatchAssembler, dict[str, float]]:
        cfg = self.cfg
        P = cfg.train.prompts_per_batch
        self._fill(P)
        triples = []
        while len(triples) < P and not self.stop:
            triples.append(self._take(self.stream.get()))
        groups, metrics = score_verified(
            triples, self.rewards, self.tokenizer, max_len=cfg.rollout.max_new_tokens
        )
        asm = grp.BatchAssembler(P, zero_variance_filter=False)
        for g in groups:
            asm.offer(g, self._version)
        metrics.update(expert_metrics(groups, min_score=cfg.sft.expert_min_score))
        self._last_groups = asm.kept
        return asm, metrics

    def _compile_ahead(self, groups: list[grp.ScoredGroup]) -> None:
        """The SFT step takes another batch than the RL step: it compiles on its first call."""

    def _train(self, asm: grp.BatchAssembler) -> list[dict[str, jax.Array]]:
        prompts, responses = expert_examples(asm.kept, min_score=self.cfg.sft.expert_min_score)
        if not prompts:
            return []
        arrays = collate_sft(
            prompts, responses, rows=self.rows, seq_len=self.seq_len + 1, pad_id=self._pad_id()
        )
        batch = to_learner(self.learner_mesh, arrays)
        out = []
        for _ in range(self.cfg.sft.expert_sft_steps):
            self.state, metrics = self.train_step(self.state, batch)
            out.append(metrics)
        return out


class ParallelTrainer(RLTrainer):
    """`algorithm: rl_sft_parallel`: RL exactly as `algorithm: rl` (rollouts, filtering,
    advantages, sync or async), except that each optimizer step is the parallel-averaging
    update (`parallel.make_parallel_step`) of that RL mini-batch with the next `sft.batch_size`
    SFT examples: two AdamW optimizers of `train.*` with independent moments, the SFT one at
    `sft.learning_rate` (default `train.learning_rate`). The SFT iterator's position is stored
    in each checkpoint (`sft_data`), so resume is exact for both streams.
    """

    def __init__(self, cfg: Config, *, stop: StopFlag | None = None):
        if cfg.sft.batch_size < 1:
            raise ValueError(f"sft.batch_size must be >= 1, got {cfg.sft.batch_size}")
        super().__init__(cfg, stop=stop)

    def _build_data(self) -> None:
        super()._build_data()
        self.sft_examples = build_sft_iterator(
            self.cfg, self.tokenizer, seed=self.cfg.data.seed + PARALLEL_SFT_SEED_OFFSET
        )

    def _init_learner(self, step: Any) -> None:
        del step  # RLTrainer's plain RL step; the parallel step builds its own RL half
        cfg = self.cfg
        sft_rows = cfg.sft.batch_size
        self.sft_optimizer = make_optimizer(cfg.train, learning_rate=cfg.sft.learning_rate)
        parallel_step = make_parallel_step(
            self.arch,
            self.optimizer,
            self.sft_optimizer,
            self.settings,
            max_len=cfg.rollout.max_new_tokens,
            n_micro_rl=micro_batches(self._batch_rows, cfg.train.micro_batch_size, "mini-batch"),
            n_micro_sft=micro_batches(sft_rows, cfg.train.micro_batch_size, "SFT batch"),
            compute_dtype=cfg.model.compute_dtype,
            temperature=cfg.rollout.temperature,
            old_from=self.old_from,
            memory=self.memory,
        )
        self.state: ParallelState = init_parallel_state(
            self.model.params, self.optimizer, self.sft_optimizer, mesh=self.learner_mesh
        )
        self.state_shardings = jax.tree_util.tree_map(lambda x: x.sharding, self.state)
        self.parallel_step = jax.jit(
            parallel_step, out_shardings=(self.state_shardings, None), donate_argnums=(0,)
        )
        self.sft_batcher = SFTBatcher(
            self.sft_examples,
            self.tokenizer,
            cfg.data.prompt_template,
            rows=sft_rows,
            seq_len=self.seq_len + 1,
            pad_id=self._pad_id(),
        )
        self.train_step = self._parallel_update

    def _parallel_update(
        self, state: ParallelState, rl_batch: dict[str, jax.Array]
    ) -> tuple[ParallelState, dict[str, jax.Array]]:
        """`RLTrainer._train`'s step for one RL mini-batch: the parallel update with the next
        SFT batch. The batch is drawn here (a few milliseconds of host work, under the dispatch
        lock `_train` holds) so that the SFT iterator only ever moves past trained batches."""
        sft_batch = to_learner(self.learner_mesh, self.sft_batcher.next_arrays())
        return self.parallel_step(state, rl_batch, sft_batch)

    def _extra_meta(self) -> dict[str, Any]:
        return {"sft_data": self.sft_examples.state()}

    def _restore_extra(self, meta: dict[str, Any]) -> None:
        self.sft_examples.restore(meta["sft_data"])
