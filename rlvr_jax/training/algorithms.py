"""`algorithm` → (batch source, learner update): the table the loop runs from.

A learner update turns a source's `Batch` into optimizer steps on the learner mesh:
- `init_state(params)`: the train state (sharded like the params);
- `compile(state, batch)`: compiles the jitted programs this batch's shapes need, ahead of
  `rlvr_jax.dispatch.LOCK` (a compile under the lock would stall the rollout thread);
- `update(state, batch) -> (state, [metrics], n)`: dispatches the `n` optimizer steps (under
  the lock, by the loop) and returns their device metrics, unfetched.

| algorithm | source | update |
|---|---|---|
| `rl` | `RolloutSource` | `RLUpdate`: old/ref log-probs when needed, `updates_per_batch` RL steps |
| `rl`, `loss.advantage: gae` | `RolloutSource` | `RLUpdate` + critic: values and GAE, PPO steps |
| `sft` | `SFTSource` | `SFTUpdate`: one SFT step |
| `expert_iteration` | `ExpertIterationSource` | `SFTUpdate`: `sft.expert_sft_steps` SFT steps |
| `rl_sft_parallel` | `PairingSource` | `RLUpdate` with the parallel-averaging step |
| `dpo` | `PreferenceSource` | `DPOUpdate`: one DPO step (`recipes/dpo_run.py`) |
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax import losses, sharding
from rlvr_jax.config.schema import Config
from rlvr_jax.training import learner
from rlvr_jax.training.batch import bucket_length, mini_batch
from rlvr_jax.training.critic import (
    CriticBuilder,
    make_ppo_step,
    make_prepare_fn,
    warn_if_unused,
)
from rlvr_jax.training.distributed import global_array
from rlvr_jax.training.optimizer import make_optimizer
from rlvr_jax.training.recipes.parallel import make_parallel_step
from rlvr_jax.training.sft import make_sft_step
from rlvr_jax.training.sources import Batch, ParallelBatch
from rlvr_jax.training.update import init_state, jit_train_step, pair_optimizer

PARALLEL_SFT_SEED_OFFSET = 1
"""`rl_sft_parallel` draws SFT examples with seed `data.seed + 1`, so that when both halves use
the same sources they do not see the same prompts in lockstep."""


@dataclasses.dataclass(frozen=True)
class Context:
    """What sources and updates are built from (the loop builds it once)."""

    cfg: Config
    model: Any
    """The policy on the learner mesh (`models.Model`)."""
    tokenizer: Any
    learner_mesh: Any
    actor_mesh: Any
    settings: losses.LossSettings
    stop: Callable[[], bool]
    timeline: Any = None

    @property
    def seq_len(self) -> int:
        """Positions a slot and a learner row hold: prompt + completion."""
        return self.cfg.data.max_prompt_len + self.cfg.rollout.max_new_tokens

    @property
    def rows(self) -> int:
        """Completions per rollout batch."""
        return self.cfg.train.prompts_per_batch * self.cfg.rollout.num_samples

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else (self.model.config.pad_token_id or 0))

    @property
    def memory(self) -> learner.MemoryOptions:
        t = self.cfg.train
        return learner.MemoryOptions(
            remat=t.remat,
            attn_chunk=t.attn_chunk,
            logits_chunk=t.logits_chunk,
            attention_impl=self.cfg.model.attention_impl,
        )

    @property
    def row_multiple(self) -> int:
        """Devices a batch's rows are split over (the learner mesh's `batch` axes)."""
        return int(np.prod([self.learner_mesh.shape[a] for a in ("data", "fsdp")]))

    def put(self, tree: Any) -> Any:
        """A batch pytree on the learner mesh, rows split by the `batch` rule. Host arrays are
        the whole batch on every process (each fills its own shards); device arrays move."""
        mesh, rules = self.learner_mesh, sharding.LEARNER_RULES

        def one(x: Any) -> Any:
            target = sharding.batch_sharding(mesh, rules, x.shape)
            if isinstance(x, jax.Array):
                return jax.device_put(x, target)
            return global_array(x, target)

        return jax.tree.map(one, tree)

    def abstract(self, tree: Any) -> Any:
        """`put(tree)`'s shapes, dtypes and shardings, without the data."""
        mesh, rules = self.learner_mesh, sharding.LEARNER_RULES
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(
                x.shape, x.dtype, sharding=sharding.batch_sharding(mesh, rules, x.shape)
            ),
            tree,
        )

    def batch_length(self, groups: list[Any]) -> int:
        """Learner positions T of a batch of scored groups: its longest prompt + completion
        rounded up to a length bucket (`train.bucket_min_len`)."""
        longest = max(
            (len(g.prompt_tokens) + len(c.tokens) for g in groups for c in g.completions),
            default=1,
        )
        t = self.cfg.train
        return bucket_length(
            longest,
            full=self.seq_len,
            min_len=t.bucket_min_len,
            multiple=math.lcm(t.attn_chunk or 1, t.logits_chunk or 1),
        )


def micro_batches(rows: int, micro_batch_size: int, what: str) -> int:
    """Micro-batches per step of `rows` rows under `train.micro_batch_size` (0 = one)."""
    if rows < 1:
        raise ValueError(f"{what} must be >= 1 rows, got {rows}")
    mb = micro_batch_size or rows
    if rows % mb:
        raise ValueError(f"train.micro_batch_size={mb} must divide the {what} of {rows} rows")
    return rows // mb


class Update:
    """Shared parts of the learner updates: the jitted step, its state, compile-ahead."""

    def __init__(self, ctx: Context, step: Callable, optimizer: Any) -> None:
        self.ctx, self.optimizer, self._pure = ctx, optimizer, step
        self.step: Callable | None = None
        self._compiled: set[Any] = set()

    def init_state(self, params: Any) -> Any:
        state = self._initial_state(params)
        self.step = jit_train_step(self._pure, jax.tree.map(lambda x: x.sharding, state))
        return state

    def _initial_state(self, params: Any) -> Any:
        return init_state(params, self.optimizer, mesh=self.ctx.learner_mesh)

    def _compile_once(self, key: Any, fn: Any, *args: Any) -> None:
        """`fn.lower(*args).compile()` once per `key` (JAX then finds the executable when the
        call under the lock comes)."""
        if key in self._compiled:
            return
        fn.lower(*args).compile()
        self._compiled.add(key)


def _shapes(tree: Any) -> tuple:
    return tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(tree))


class SFTUpdate(Update):
    """`repeat` SFT optimizer steps on each batch (1 for `sft`, `sft.expert_sft_steps` for
    expert iteration)."""

    def __init__(self, ctx: Context, *, rows: int, repeat: int) -> None:
        cfg = ctx.cfg
        optimizer = make_optimizer(cfg.train)
        n_micro = micro_batches(rows, cfg.train.micro_batch_size, "SFT batch")
        if cfg.train.max_tokens_per_micro_batch:
            n_micro = None  # packed batches carry their own micro-batch count
        step = make_sft_step(
            ctx.model.config, optimizer, compute_dtype=cfg.model.compute_dtype, n_micro=n_micro
        )
        super().__init__(ctx, step, optimizer)
        self.repeat = repeat

    def compile(self, state: Any, batch: Batch) -> None:
        if batch.arrays is not None:
            arrays = self.ctx.abstract(batch.arrays)
            self._compile_once(_shapes(arrays), self.step, state, arrays)

    def update(self, state: Any, batch: Batch) -> tuple[Any, list, int]:
        if batch.arrays is None:
            return state, [], 0
        arrays = self.ctx.put(batch.arrays)
        out = []
        for _ in range(self.repeat):
            state, metrics = self.step(state, arrays)
            out.append(metrics)
        return state, out, self.repeat


class RLUpdate(Update):
    """`train.updates_per_batch` optimizer steps on mini-batches of each RL batch, after the
    log-probs the loss needs from the learner: θ_old's (several updates per batch, TIS mask
    mode, reward-KL), the reference policy's (KL on). With `parallel`, each step is the
    parallel-averaging update with the SFT rows of its mini-batch."""

    def __init__(self, ctx: Context, *, parallel: bool = False) -> None:
        cfg, settings = ctx.cfg, ctx.settings
        u = cfg.train.updates_per_batch
        if ctx.rows % u:
            raise ValueError(
                f"train.updates_per_batch={u} must divide the batch of {ctx.rows} completions"
            )
        self.mini, self.updates, self.parallel = ctx.rows // u, u, parallel
        n_micro = micro_batches(self.mini, cfg.train.micro_batch_size, "mini-batch")
        if cfg.train.max_tokens_per_micro_batch:
            n_micro = None  # packed batches carry their own micro-batch count
        common = dict(
            max_len=cfg.rollout.max_new_tokens,
            compute_dtype=cfg.model.compute_dtype,
            temperature=cfg.rollout.temperature,
            memory=ctx.memory,
        )
        optimizer = make_optimizer(cfg.train)
        self.critic: CriticBuilder | None = None
        warn_if_unused(cfg, settings)
        if settings.uses_critic:
            if parallel:
                raise ValueError(
                    "loss.advantage: gae (PPO with a critic) works with algorithm: rl, "
                    "not rl_sft_parallel"
                )
            self.critic = CriticBuilder(cfg, ctx.model, ctx.learner_mesh, ctx.memory)
            step = make_ppo_step(
                ctx.model.config,
                self.critic.critic,
                optimizer,
                self.critic.optimizer,
                settings,
                n_micro=n_micro,
                **common,
            )
            self.prepare = make_prepare_fn(self.critic.critic, settings)
        elif parallel:
            sft_opt = make_optimizer(cfg.train, learning_rate=cfg.sft.learning_rate)
            n_micro_sft = micro_batches(cfg.sft.batch_size, cfg.train.micro_batch_size, "SFT batch")
            step = make_parallel_step(
                ctx.model.config,
                optimizer,
                sft_opt,
                settings,
                n_micro_rl=n_micro,
                n_micro_sft=n_micro_sft,
                **common,
            )
            optimizer = pair_optimizer(optimizer, sft_opt)
        else:
            step = learner.make_train_step(
                ctx.model.config, optimizer, settings, n_micro=n_micro, **common
            )
        super().__init__(ctx, step, optimizer)
        self.logprob = learner.make_logprob_fn(
            ctx.model.config,
            compute_dtype=cfg.model.compute_dtype,
            temperature=cfg.rollout.temperature,
            memory=ctx.memory,
        )
        self.needs_old = (
            (u > 1 and settings.ratio_denominator == "old")
            or settings.tis_mode == "mask"
            or settings.reward_kl_coef > 0
        )
        self.ref_params = ctx.model.params if settings.needs_ref_logp else None

    def _initial_state(self, params: Any) -> Any:
        state = super()._initial_state(params)
        return state if self.critic is None else state.replace(critic=self.critic.init())

    def _parts(self, arrays: Any) -> tuple[Any, Any]:
        """(RL batch, SFT rows or None) of a batch's arrays."""
        if isinstance(arrays, ParallelBatch):
            return arrays.rl, arrays.sft
        return arrays, None

    def compile(self, state: Any, batch: Batch) -> None:
        if batch.arrays is None:
            return
        rl, sft = self._parts(batch.arrays)
        full = self.ctx.abstract(rl)
        if self.needs_old or self.ref_params is not None:
            self._compile_once(("logprob", _shapes(full)), self.logprob, state.params, full)
        mini = self.ctx.abstract(mini_batch(rl, 0, self.updates))
        learner_logp = []
        if self.needs_old:
            learner_logp.append("old_logp_BxT")
        if self.ref_params is not None:
            learner_logp.append("ref_logp_BxT")
        mini = mini.replace(**{k: mini.sampler_logp_BxT for k in learner_logp})
        if self.critic is not None:
            full = full.replace(**{k: full.sampler_logp_BxT for k in learner_logp})
            args = (state.params, state.critic.params, full)
            self._compile_once(("prepare", _shapes(full)), self.prepare, *args)
            ppo = ("values_BxT", "advantages_BxT", "returns_BxT")
            mini = mini.replace(**{k: mini.sampler_logp_BxT for k in ppo})
        args = (state, mini)
        if sft is not None:
            args = (state, mini, self.ctx.abstract(mini_batch(sft, 0, self.updates)))
        self._compile_once(tuple(_shapes(a) for a in args[1:]), self.step, *args)

    def update(self, state: Any, batch: Batch) -> tuple[Any, list, int]:
        if batch.arrays is None:
            return state, [], 0
        rl, sft = self._parts(batch.arrays)
        full = self.ctx.put(rl)
        if self.needs_old:
            full = full.replace(old_logp_BxT=self.logprob(state.params, full))
        if self.ref_params is not None:
            full = full.replace(ref_logp_BxT=self.logprob(self.ref_params, full))
        before: dict[str, Any] = {}
        if self.critic is not None:  # GAE from the critic's values of the rollout tokens
            full, before = self.prepare(state.params, state.critic.params, full)
            full = self.ctx.put(full)
        elif self.ctx.settings.reward_kl_coef > 0:
            full = full.replace(advantages_B=self._kl_advantages(full, batch))
        if self.ctx.cfg.train.save_batch:
            self._save(state, full, batch)
        out = []
        for u in range(self.updates):
            mini = full if self.updates == 1 else self.ctx.put(mini_batch(full, u, self.updates))
            if sft is None:
                state, metrics = self.step(state, mini)
            else:
                state, metrics = self.step(
                    state, mini, self.ctx.put(mini_batch(sft, u, self.updates))
                )
            out.append({**metrics, **before})
        return state, out, self.updates

    def _save(self, state: Any, full: Any, batch: Batch) -> None:
        """`train.save_batch`: the batch as a loss-lab file (`rlvr-bench losses --batch`)."""
        from rlvr_jax.losses.batch_file import save_batch

        old = full.old_logp_BxT
        if old is None:
            old = self.logprob(state.params, full)
        # the completions in sample order (groups of G), as the loss lab reads them
        slots = batch.slots
        advantages = full.advantages_B if full.advantages_BxT is None else full.advantages_BxT
        extra = {} if full.ref_logp_BxT is None else {"ref_logp": full.ref_logp_BxT[slots]}
        save_batch(
            self.ctx.cfg.train.save_batch,
            logp=old[slots],
            old_logp=old[slots],
            sampler_logp=full.sampler_logp_BxT[slots],
            advantages=advantages[slots],
            mask=full.mask_BxT[slots],
            rewards=batch.rewards_B,
            group_size=np.asarray(batch.group_size),
            max_len=np.asarray(self.ctx.cfg.rollout.max_new_tokens),
            **extra,
        )

    def _kl_advantages(self, full: Any, batch: Batch) -> jax.Array:
        """`loss.kl_mode: reward`: advantages of the KL-penalised rewards (the penalty needs
        the learner's old and reference log-probs), 0 on padding rows."""
        settings, slots = self.ctx.settings, jnp.asarray(batch.slots)
        penalised_N = losses.kl_reward_penalty(
            jnp.asarray(batch.rewards_B),
            logp=full.old_logp_BxT[slots],
            ref_logp=full.ref_logp_BxT[slots],
            mask=full.mask_BxT[slots],
            kl_coef=settings.reward_kl_coef,
            kl_estimator=settings.kl_estimator,
        )
        adv_N = losses.advantages(
            settings.advantage, penalised_N.reshape(-1, batch.group_size)
        ).reshape(-1)
        adv_B = jnp.zeros(full.advantages_B.shape, jnp.float32).at[slots].set(adv_N)
        return self.ctx.put(adv_B)


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """How an `algorithm` builds its source and its learner update."""

    source: Callable[[Context, Any, int], Any]
    """(context, params, policy version) → the batch source (its engine starts from params)."""
    update: Callable[[Context], Update]


def _rl_update(ctx: Context) -> Update:
    return RLUpdate(ctx)


def _parallel_update(ctx: Context) -> Update:
    if ctx.cfg.sft.batch_size < 1:
        raise ValueError(f"sft.batch_size must be >= 1, got {ctx.cfg.sft.batch_size}")
    return RLUpdate(ctx, parallel=True)


def _sft_update(ctx: Context) -> Update:
    if ctx.cfg.sft.batch_size < 1:
        raise ValueError(f"sft.batch_size must be >= 1, got {ctx.cfg.sft.batch_size}")
    return SFTUpdate(ctx, rows=ctx.cfg.sft.batch_size, repeat=1)


def _expert_update(ctx: Context) -> Update:
    sft = ctx.cfg.sft
    if not 0.0 < sft.expert_min_score <= 1.0:
        raise ValueError(
            f"sft.expert_min_score must be in (0, 1] (verifier scores are in [0, 1]; <= 0 "
            f"would keep unverified samples), got {sft.expert_min_score}"
        )
    if sft.expert_sft_steps < 1:
        raise ValueError(f"sft.expert_sft_steps must be >= 1, got {sft.expert_sft_steps}")
    return SFTUpdate(ctx, rows=ctx.rows, repeat=sft.expert_sft_steps)


def _lazy(name: str) -> Callable:
    """A source builder of `rlvr_jax.training.source_builders`, imported when used (it pulls
    the engine and the reward service)."""

    def build(ctx: Context, params: Any, version: int) -> Any:
        from rlvr_jax.training import source_builders

        return getattr(source_builders, name)(ctx, params, version)

    return build


def _dpo_source(ctx: Context, params: Any, version: int) -> Any:
    from rlvr_jax.training.recipes.dpo_run import dpo_source

    return dpo_source(ctx, params, version)


def _dpo_update(ctx: Context) -> Update:
    from rlvr_jax.training.recipes.dpo_run import DPOUpdate

    return DPOUpdate(ctx)


ALGORITHMS: dict[str, Algorithm] = {
    "rl": Algorithm(_lazy("rl_source"), _rl_update),
    "sft": Algorithm(_lazy("sft_source"), _sft_update),
    "expert_iteration": Algorithm(_lazy("expert_source"), _expert_update),
    "rl_sft_parallel": Algorithm(_lazy("parallel_source"), _parallel_update),
    "dpo": Algorithm(_dpo_source, _dpo_update),
}
"""The source and the learner update of each `algorithm`."""


def get_algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm: unknown {name!r}; expected one of {list(ALGORITHMS)}")
    return ALGORITHMS[name]


__all__ = ["ALGORITHMS", "Algorithm", "Context", "get_algorithm"]
