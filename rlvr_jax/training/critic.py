"""PPO's learned critic (`loss.advantage: gae`): the value model, the per-batch GAE preparation
and the PPO step.

The value model is a scalar head V(s_t) = h_t · w + b (fp32, zero-initialised) on a trunk's
final-norm hidden states h_t [B, T, D]: its own model with `critic.kind: separate`
(`critic.path`, default the policy's starting checkpoint, LM head dropped), or the policy's
trunk with `shared` (the value loss, weighted by `critic.value_coef`, then trains it too).

The critic's parameters and AdamW state live in `TrainState.critic` (checkpointed with the
policy); one step minimises policy loss + c_V · value loss, each optimizer over its own
parameters (the critic's at `critic.learning_rate`); a non-finite loss or gradient skips both.

Per rollout batch, before the first update, `make_prepare_fn` turns the rewards at the
completions' last tokens (minus β·KL per token with `loss.kl_mode: reward`) into GAE
advantages and value targets (`losses.gae`). The critic reads the packed rows [R, T]; its
values are seen per completion slot [B, T] (`batch.sequence_view`), each slot one episode, so
every result is the same however the rows are packed.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from rlvr_jax import losses, models, sharding
from rlvr_jax.config.schema import Config, CriticConfig
from rlvr_jax.losses.kl import kl_per_token
from rlvr_jax.losses.masked import masked_mean, masked_std
from rlvr_jax.training import learner
from rlvr_jax.training.batch import RLBatch, TokenBatch, sequence_view
from rlvr_jax.training.optimizer import make_optimizer
from rlvr_jax.training.update import (
    TrainState,
    accumulate_grads,
    apply_update,
    init_state,
    micro_count,
    optimizer_step,
    per_micro_batch,
)

log = logging.getLogger("rlvr_jax.train")


@flax.struct.dataclass
class CriticState:
    """The value model's parameters and its optimizer state (part of `TrainState`)."""

    params: Any
    """{"head": {"w_D", "b"}} plus {"trunk": model params} for a separate critic."""
    opt_state: Any


def value_head(d_model: int) -> dict[str, jax.Array]:
    """A zero-initialised scalar head: V = 0 everywhere until the critic learns."""
    return {"w_D": jnp.zeros((d_model,), jnp.float32), "b": jnp.zeros((), jnp.float32)}


def head_values(head: dict[str, jax.Array], hidden_BxTxD: jax.Array) -> jax.Array:
    """V [B, T] in fp32 of hidden states [B, T, D]."""
    h_BxTxD = hidden_BxTxD.astype(jnp.float32)
    return jnp.einsum("BTD,D->BT", h_BxTxD, head["w_D"]) + head["b"]


@dataclasses.dataclass(frozen=True)
class Critic:
    """What the jitted functions close over (static): the critic's settings and architecture."""

    cfg: CriticConfig
    arch: models.ArchConfig
    """The trunk's architecture (the policy's for `shared`)."""
    compute_dtype: Any
    memory: learner.MemoryOptions

    @property
    def shared(self) -> bool:
        return self.cfg.kind == "shared"

    def hidden(self, trunk: Any, tokens: TokenBatch) -> jax.Array:
        """The final-norm hidden states [R, T, D] of the rows `tokens` under `trunk`."""
        return learner.hidden_states(
            trunk, self.arch, tokens, compute_dtype=self.compute_dtype, memory=self.memory
        )

    def values(self, params: Any, tokens: TokenBatch, policy_hidden_RxTxD: jax.Array) -> jax.Array:
        """V(s_t) [R, T] of the rows `tokens`: on the policy's (`shared`) or the trunk's hidden."""
        shared = self.shared
        hidden_RxTxD = policy_hidden_RxTxD if shared else self.hidden(params["trunk"], tokens)
        return head_values(params["head"], hidden_RxTxD)

    def slot_values(self, policy_params: Any, params: Any, batch: RLBatch) -> jax.Array:
        """V(s_t) [B, T] per completion slot of a batch (or one micro-batch of it)."""
        trunk = policy_params if self.shared else params["trunk"]
        values_RxT = head_values(params["head"], self.hidden(trunk, batch.tokens))
        return sequence_view(values_RxT, batch.gather_BxT)


def warn_if_unused(cfg: Config, settings: losses.LossSettings) -> None:
    """Logs a warning when `critic.*` is set but no critic is trained (no `gae`)."""
    if not settings.uses_critic and cfg.critic != CriticConfig():
        log.warning(
            "critic.* is set but loss.advantage is %r, not 'gae': no critic is trained",
            settings.advantage,
        )


class CriticBuilder:
    """The critic of a run: its separate trunk, its optimizer and its initial state."""

    def __init__(
        self, cfg: Config, policy: models.Model, mesh: Any, memory: learner.MemoryOptions
    ) -> None:
        """`memory`: the policy's (`Context.memory`)."""
        self.mesh = mesh
        memory = dataclasses.replace(memory, logits_chunk=0)  # a value head has no logits
        self.trunk: Any = None
        arch = policy.config
        if cfg.critic.kind == "separate":
            path = cfg.critic.path or policy.path
            if path is None:
                raise ValueError("critic.path: the policy has no checkpoint path to start from")
            model = models.load_pretrained(
                path, dtype=cfg.model.param_dtype, mesh=mesh, rules=sharding.LEARNER_RULES
            )
            arch = model.config
            if arch.vocab_size < policy.config.vocab_size:
                raise ValueError(
                    f"critic.path {path}: vocab_size {arch.vocab_size} < the policy's "
                    f"{policy.config.vocab_size} (the critic reads the policy's token ids)"
                )
            # the value head replaces the LM head: its parameters would only take memory
            self.trunk = {k: v for k, v in model.params.items() if k != "lm_head"}
        self.critic = Critic(cfg.critic, arch, cfg.model.compute_dtype, memory)
        self.optimizer = make_optimizer(cfg.train, learning_rate=cfg.critic.learning_rate)

    def init(self) -> CriticState:
        """The initial critic state (zero head; the loaded trunk for `separate`)."""
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        params = {"head": jax.device_put(value_head(self.critic.arch.d_model), replicated)}
        if self.trunk is not None:
            params["trunk"] = self.trunk
        state = init_state(params, self.optimizer, mesh=self.mesh)
        return CriticState(params=state.params, opt_state=state.opt_state)


def make_prepare_fn(critic: Critic, settings: losses.LossSettings) -> Callable:
    """`prepare(policy_params, critic_params, batch) -> (batch, metrics)` (jitted): the batch
    with `values_BxT`, `advantages_BxT` (whitened with `critic.whiten_advantages`) and
    `returns_BxT`; metrics `value/explained_variance`, `value/return_mean`, `value/gae_mean`,
    `value/gae_std` (before whitening) over the whole batch. With `loss.kl_mode: reward` the
    batch must carry old and reference log-probs."""
    cfg = critic.cfg

    def prepare(policy_params: Any, critic_params: Any, batch: RLBatch):
        if batch.rewards_BxT is None:
            raise ValueError("PPO needs the batch's per-token rewards (RLBatch.rewards_BxT)")
        # packed for several micro-batches: each one's gather indexes its own rows
        values_BxT = per_micro_batch(
            lambda mb: critic.slot_values(policy_params, critic_params, mb), batch
        )
        mask_BxT = batch.mask_BxT
        rewards_BxT = batch.rewards_BxT
        if settings.reward_kl_coef > 0:
            if batch.old_logp_BxT is None or batch.ref_logp_BxT is None:
                raise ValueError("loss.kl_mode: reward needs old and reference log-probs")
            kl_BxT = kl_per_token(settings.kl_estimator, batch.old_logp_BxT, batch.ref_logp_BxT)
            rewards_BxT = rewards_BxT - settings.reward_kl_coef * jnp.where(
                mask_BxT > 0, kl_BxT, 0.0
            )
        # each completion slot is one episode (masked positions inside it are stepped over)
        adv_BxT, returns_BxT = losses.gae(
            rewards_BxT,
            values_BxT,
            mask_BxT,
            gamma=cfg.gamma,
            lam=cfg.lam,
            segment_ids_BxT=jnp.ones(mask_BxT.shape, jnp.int32),
        )
        values_BxT = jnp.where(mask_BxT > 0, values_BxT, 0.0)
        metrics = {
            "value/explained_variance": losses.explained_variance(
                values_BxT, returns_BxT, mask_BxT
            ),
            "value/return_mean": masked_mean(returns_BxT, mask_BxT),
            "value/gae_mean": masked_mean(adv_BxT, mask_BxT),
            "value/gae_std": masked_std(adv_BxT, mask_BxT),
        }
        if cfg.whiten_advantages:
            adv_BxT = losses.whiten(adv_BxT, mask_BxT)
        batch = batch.replace(
            values_BxT=values_BxT, advantages_BxT=adv_BxT, returns_BxT=returns_BxT
        )
        return batch, metrics

    return jax.jit(prepare)


def make_ppo_step(
    arch: models.ArchConfig,
    critic: Critic,
    optimizer: optax.GradientTransformation,
    critic_optimizer: optax.GradientTransformation,
    settings: losses.LossSettings,
    *,
    max_len: int,
    n_micro: int | None = None,
    compute_dtype: Any = jnp.float32,
    temperature: float = 1.0,
    memory: learner.MemoryOptions = learner.NO_MEMORY_SAVING,
) -> Callable[[TrainState, RLBatch], tuple[TrainState, dict[str, jax.Array]]]:
    """The pure PPO step (un-jitted) over a batch from `make_prepare_fn`: `accumulate_grads` of
    policy loss + c_V · value loss over (policy, critic) params in `n_micro` micro-batches (a
    packed batch's own count), then each optimizer on its own gradients. Metrics, over the
    whole batch: the policy loss's, `value/*`, `policy_loss`, `loss` (the sum minimised),
    `grad_norm`, `value/grad_norm`, `step_ok`."""
    coef, clip = critic.cfg.value_coef, critic.cfg.value_clip

    def step(state: TrainState, batch: RLBatch):
        objective = learner.batch_objective(settings, batch, max_len=max_len)
        value_denominator = jnp.maximum(jnp.sum(batch.mask_BxT), 1.0)

        def value_term(values_BxT: jax.Array, b: RLBatch):
            return losses.value_loss(
                values_BxT,
                old_values=b.values_BxT,
                returns=b.returns_BxT,
                mask=b.mask_BxT,
                clip=clip,
                denominator=value_denominator,
            )

        def loss_fn(params: tuple[Any, Any], mb: RLBatch):
            policy_params, critic_params = params
            hidden_RxTxD = learner.hidden_states(
                policy_params, arch, mb.tokens, compute_dtype=compute_dtype, memory=memory
            )
            logp_BxT = learner.slot_logprobs_of_hidden(
                policy_params, arch, hidden_RxTxD, mb, temperature=temperature, memory=memory
            )
            policy_loss, _ = objective(logp_BxT, mb)
            values_RxT = critic.values(critic_params, mb.tokens, hidden_RxTxD)
            values_BxT = sequence_view(values_RxT, mb.gather_BxT)
            v_loss, _ = value_term(values_BxT, mb)
            aux = {
                "logp": jax.lax.stop_gradient(logp_BxT),
                "values": jax.lax.stop_gradient(values_BxT),
                "policy_loss": jax.lax.stop_gradient(policy_loss),
            }
            return policy_loss + coef * v_loss, aux

        params = (state.params, state.critic.params)
        n = micro_count(batch, n_micro)
        grads, loss, aux_M = accumulate_grads(loss_fn, params, batch, n)
        g_policy, g_critic = grads
        finite = jnp.isfinite(loss) & jnp.isfinite(optax.global_norm(g_critic))
        new_state, ok = apply_update(state, g_policy, optimizer, finite=finite)
        critic_params, critic_opt = optimizer_step(
            state.critic.params, state.critic.opt_state, g_critic, critic_optimizer, ok
        )
        new_state = new_state.replace(critic=CriticState(critic_params, critic_opt))
        # metrics over the whole batch (exact however it was split and packed)
        shape = batch.mask_BxT.shape
        _, metrics = objective(aux_M["logp"].reshape(shape), batch)
        _, v_metrics = value_term(aux_M["values"].reshape(shape), batch)
        metrics.update(v_metrics)
        metrics.update(
            policy_loss=aux_M["policy_loss"].sum(),
            loss=loss,
            grad_norm=optax.global_norm(g_policy),
            step_ok=ok.astype(jnp.float32),
        )
        metrics["value/grad_norm"] = optax.global_norm(g_critic)
        return new_state, metrics

    return step


__all__ = [
    "Critic",
    "CriticBuilder",
    "CriticState",
    "head_values",
    "make_ppo_step",
    "make_prepare_fn",
    "value_head",
    "warn_if_unused",
]
