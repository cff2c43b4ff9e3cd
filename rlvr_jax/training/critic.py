"""PPO's learned critic (`loss.advantage: gae`): the value model, its place in the train state,
the per-batch GAE preparation and the PPO step.

The value model is a scalar head V(s_t) = h_t · w + b (fp32, zero-initialised) on a trunk's
final-norm hidden states h_t [B, T, D]:

- `critic.kind: separate`: the trunk is its own model (`critic.path`, default the policy's
  starting checkpoint; its LM head is dropped), trained only by the value loss;
- `critic.kind: shared`: the head sits on the policy's trunk; the value loss then trains the
  trunk too, weighted by `critic.value_coef`.

Either way the critic's parameters and AdamW state live in `TrainState.critic` (checkpointed
with the policy: resume is exact), and one step minimises policy loss + c_V · value loss with
two optimizers: the policy's over the policy's parameters, the critic's (`critic.learning_rate`)
over the critic's. A non-finite loss or gradient skips both.

Per rollout batch, before the first update (like θ_old's log-probs), `make_prepare_fn` runs
the critic over the rollout tokens and turns the rewards at the completions' last tokens
(minus β·KL per token with `loss.kl_mode: reward`) into GAE advantages and value targets
(`losses.gae`), whitened over the batch's completion tokens when `critic.whiten_advantages`.
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
from rlvr_jax.training.batch import RLBatch
from rlvr_jax.training.optimizer import make_optimizer
from rlvr_jax.training.update import (
    TrainState,
    accumulate_grads,
    apply_update,
    combine_metrics,
    init_state,
    optimizer_step,
)

log = logging.getLogger("rlvr_jax.train")

NO_MEMORY_OPTIONS = learner.MemoryOptions()

SUMMED_METRICS = ("value/loss", "policy_loss")
"""Per-micro-batch metrics already divided by the whole batch's denominator: summed."""


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

    def values(
        self, params: Any, batch: RLBatch, *, policy_hidden_BxTxD: jax.Array | None = None
    ) -> jax.Array:
        """V(s_t) [B, T] of every position: on the policy's hidden states (`shared`, passed
        in) or on the separate trunk's."""
        if self.shared:
            if policy_hidden_BxTxD is None:
                raise ValueError("a shared critic needs the policy's hidden states")
            hidden_BxTxD = policy_hidden_BxTxD
        else:
            hidden_BxTxD = learner.hidden_states(
                params["trunk"],
                self.arch,
                batch,
                compute_dtype=self.compute_dtype,
                memory=self.memory,
            )
        return head_values(params["head"], hidden_BxTxD)


def warn_if_unused(cfg: Config, settings: losses.LossSettings) -> None:
    """Logs a warning when `critic.*` is set but no critic is trained (no `gae`)."""
    if not settings.uses_critic and cfg.critic != CriticConfig():
        log.warning(
            "critic.* is set but loss.advantage is %r, not 'gae': no critic is trained",
            settings.advantage,
        )


def check_config(cfg: Config) -> None:
    """Raises ValueError naming the `critic.*` key of an invalid setting."""
    c = cfg.critic
    for key in ("gamma", "lam"):
        value = getattr(c, key)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"critic.{key} must be in [0, 1], got {value}")
    if not c.value_coef > 0:
        raise ValueError(f"critic.value_coef must be > 0, got {c.value_coef}")
    if c.value_clip is not None and c.value_clip < 0:
        raise ValueError(f"critic.value_clip must be >= 0 (or null: off), got {c.value_clip}")
    if c.learning_rate is not None and not c.learning_rate > 0:
        raise ValueError(f"critic.learning_rate must be > 0, got {c.learning_rate}")


class CriticBuilder:
    """Builds the critic of a run: loads the separate trunk (on the learner mesh), makes the
    critic's optimizer and, from the policy's parameters, its initial state."""

    def __init__(self, cfg: Config, policy: models.Model, mesh: Any) -> None:
        check_config(cfg)
        self.mesh = mesh
        memory = learner.MemoryOptions(
            remat=cfg.train.remat, attn_chunk=cfg.train.attn_chunk, logits_chunk=0
        )
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
    with `values_BxT`, `advantages_BxT` and `returns_BxT` of its rollout tokens (see the
    module docstring); metrics `value/explained_variance` (of the rollout-time values against
    the returns), `value/return_mean`, `value/gae_mean`, `value/gae_std` (before whitening).
    With `loss.kl_mode: reward` the batch must carry old and reference log-probs."""
    cfg = critic.cfg

    def prepare(policy_params: Any, critic_params: Any, batch: RLBatch):
        if batch.rewards_BxT is None:
            raise ValueError("PPO needs the batch's per-token rewards (RLBatch.rewards_BxT)")
        hidden = None
        if critic.shared:
            hidden = learner.hidden_states(
                policy_params,
                critic.arch,
                batch,
                compute_dtype=critic.compute_dtype,
                memory=critic.memory,
            )
        values_BxT = critic.values(critic_params, batch, policy_hidden_BxTxD=hidden)
        mask_BxT = batch.mask_BxT
        rewards_BxT = batch.rewards_BxT
        if settings.reward_kl_coef > 0:
            if batch.old_logp_BxT is None or batch.ref_logp_BxT is None:
                raise ValueError("loss.kl_mode: reward needs old and reference log-probs")
            kl_BxT = kl_per_token(settings.kl_estimator, batch.old_logp_BxT, batch.ref_logp_BxT)
            rewards_BxT = rewards_BxT - settings.reward_kl_coef * jnp.where(
                mask_BxT > 0, kl_BxT, 0.0
            )
        adv_BxT, returns_BxT = losses.gae(
            rewards_BxT,
            values_BxT,
            mask_BxT,
            gamma=cfg.gamma,
            lam=cfg.lam,
            segment_ids_BxT=batch.segment_ids_BxT,
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
    n_micro: int = 1,
    compute_dtype: Any = jnp.float32,
    temperature: float = 1.0,
    memory: learner.MemoryOptions = NO_MEMORY_OPTIONS,
) -> Callable[[TrainState, RLBatch], tuple[TrainState, dict[str, jax.Array]]]:
    """The pure PPO step (un-jitted): `accumulate_grads` of policy loss + c_V · value loss over
    (policy params, critic params), then each optimizer on its own gradients. The batch holds
    `advantages_BxT`, `returns_BxT` and `values_BxT` (`make_prepare_fn`). Metrics: the policy
    loss's, `value/*` (value_loss's; `value/loss` is the whole batch's), `policy_loss`, `loss`
    (the sum minimised), `grad_norm`, `value/grad_norm`, `step_ok`."""
    coef, clip = critic.cfg.value_coef, critic.cfg.value_clip

    def step(state: TrainState, batch: RLBatch):
        policy = learner.batch_policy_loss(settings, batch, max_len=max_len)
        value_denominator = jnp.maximum(jnp.sum(batch.mask_BxT), 1.0)

        def loss_fn(params: tuple[Any, Any], mb: RLBatch):
            policy_params, critic_params = params
            hidden_BxTxD = learner.hidden_states(
                policy_params, arch, mb, compute_dtype=compute_dtype, memory=memory
            )
            logp_BxT = learner.logprobs_of_hidden(
                policy_params,
                arch,
                hidden_BxTxD,
                mb.target_ids_BxT,
                temperature=temperature,
                memory=memory,
            )
            policy_loss, metrics = policy(logp_BxT, mb)
            values_BxT = critic.values(critic_params, mb, policy_hidden_BxTxD=hidden_BxTxD)
            v_loss, v_metrics = losses.value_loss(
                values_BxT,
                old_values=mb.values_BxT,
                returns=mb.returns_BxT,
                mask=mb.mask_BxT,
                clip=clip,
                denominator=value_denominator,
            )
            return policy_loss + coef * v_loss, {**metrics, **v_metrics, "policy_loss": policy_loss}

        params = (state.params, state.critic.params)
        grads, loss, metrics_M = accumulate_grads(loss_fn, params, batch, n_micro)
        g_policy, g_critic = grads
        finite = jnp.isfinite(loss) & jnp.isfinite(optax.global_norm(g_critic))
        new_state, ok = apply_update(state, g_policy, optimizer, finite=finite)
        critic_params, critic_opt = optimizer_step(
            state.critic.params, state.critic.opt_state, g_critic, critic_optimizer, ok
        )
        new_state = new_state.replace(critic=CriticState(critic_params, critic_opt))
        metrics = combine_metrics(metrics_M, summed=SUMMED_METRICS)
        metrics.update(
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
    "check_config",
    "head_values",
    "make_ppo_step",
    "make_prepare_fn",
    "value_head",
    "warn_if_unused",
]
