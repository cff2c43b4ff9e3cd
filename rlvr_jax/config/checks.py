"""The checks of a loaded config that span several keys, run by `rlvr_jax.config.load` before
any model or data is loaded (and by the trainer, for a `Config` built in Python): errors name
the key and the file.

- `rollout.interrupt` and `rollout.push_*` against the rest of `rollout`; `eval.*` against
  `data.eval_sources`;
- `model.lora` and `rollout.weight_dtype`;
- what `rollout.backend` cannot honour (its capability table, `rlvr_jax.rollout.capabilities`);
- `env.*` against `rollout` and `algorithm`;
- the `loss:` section, resolved with its preset (`rlvr_jax.losses.LossSettings`);
- what the `algorithm` needs of the config (its `validate` in `rlvr_jax.training.algorithms`).

What needs the model, the data or the machine is checked where those are loaded;
`check_runtime` checks what this machine must have to run a config (not to plan it).
"""

from __future__ import annotations

from rlvr_jax.config import schema


class ConfigError(ValueError):
    """A config problem; the message names the key and where it came from."""


def check(cfg: schema.Config, *, source: str = "<config>") -> None:
    """Raises ConfigError (`<source>: <the key's problem>`) for the first failed check."""
    from rlvr_jax.losses import loss_settings_from_config
    from rlvr_jax.rollout.capabilities import refused
    from rlvr_jax.training.algorithms import get_algorithm

    try:
        why = refused(cfg)
        if why:
            raise ValueError(why)
        _check_interrupt(cfg.rollout)
        _check_push(cfg.rollout)
        _check_lora(cfg)
        _check_env(cfg)
        _check_eval(cfg)
        if cfg.mesh.num_devices < 0:
            raise ValueError(f"mesh.num_devices must be >= 0 (0 = all), got {cfg.mesh.num_devices}")
        loss_settings_from_config(cfg.loss)
        get_algorithm(cfg.algorithm).validate(cfg)
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from None


def _check_eval(cfg: schema.Config) -> None:
    """pass@k needs k <= n samples; an in-loop evaluation needs held-out prompts."""
    e = cfg.eval
    bad = [k for k in e.ks if not 1 <= k <= e.num_samples]
    if bad:
        raise ValueError(f"eval.ks: pass@{bad[0]} needs 1 <= k <= eval.num_samples={e.num_samples}")
    if e.every_steps and not cfg.data.eval_sources:
        raise ValueError(
            f"eval.every_steps={e.every_steps} evaluates on data.eval_sources, which is empty"
        )


def _check_push(rollout: schema.RolloutConfig) -> None:
    """`rollout.push_*`: a timeout >= 0, a probe that fits a completion, a tolerance > 0."""
    if rollout.push_timeout_s < 0:
        raise ValueError(
            f"rollout.push_timeout_s must be >= 0 (0 = none), got {rollout.push_timeout_s}"
        )
    if not 0 <= rollout.push_probe_tokens <= rollout.max_new_tokens:
        raise ValueError(
            f"rollout.push_probe_tokens must be in [0, rollout.max_new_tokens="
            f"{rollout.max_new_tokens}], got {rollout.push_probe_tokens}"
        )
    if not rollout.push_probe_tolerance > 0:
        raise ValueError(
            f"rollout.push_probe_tolerance must be > 0, got {rollout.push_probe_tolerance}"
        )


def _check_lora(cfg: schema.Config) -> None:
    """`model.lora`'s values."""
    lo = cfg.model.lora
    if lo.rank < 0:
        raise ValueError(f"model.lora.rank must be >= 0 (0 = off), got {lo.rank}")
    if not lo.rank:
        if lo.base_dtype != "param":
            raise ValueError(
                f"model.lora.base_dtype: {lo.base_dtype} needs LoRA (model.lora.rank > 0): only "
                "a frozen base is stored quantized"
            )
    else:
        if lo.alpha <= 0:
            raise ValueError(f"model.lora.alpha must be > 0, got {lo.alpha}")
        if not 0 <= lo.dropout < 1:
            raise ValueError(f"model.lora.dropout must be in [0, 1), got {lo.dropout}")
        bad = sorted(set(lo.targets) - set(schema.LORA_TARGETS))
        if bad or not lo.targets:
            raise ValueError(
                f"model.lora.targets: {bad or 'empty'}; expected a non-empty subset of "
                f"{list(schema.LORA_TARGETS)}"
            )


def _check_env(cfg: schema.Config) -> None:
    """A multi-turn environment needs no budget forcing, and `algorithm: rl`
    (the other algorithms would train on the environment's tokens)."""
    env = cfg.env
    if env.max_turns < 1 or env.workers < 1 or env.tool_timeout_s <= 0:
        raise ValueError(
            "env: max_turns and workers must be >= 1 and tool_timeout_s > 0, got "
            f"{env.max_turns}, {env.workers} and {env.tool_timeout_s}"
        )
    if env.name is None:
        return
    if cfg.rollout.interrupt.thinking_budget:
        raise ValueError(
            f"env.name={env.name!r} and rollout.interrupt (budget forcing) cannot be combined; "
            "set rollout.interrupt.thinking_budget: 0"
        )
    if cfg.algorithm != "rl":
        raise ValueError(f"env.name={env.name!r} needs algorithm: rl, not {cfg.algorithm}")


def _check_interrupt(rollout: schema.RolloutConfig) -> None:
    """`rollout.interrupt`'s values and what they need of the rest of `rollout`."""
    it = rollout.interrupt
    if it.thinking_budget < 0 or it.answer_budget < 1:
        raise ValueError(
            "rollout.interrupt: thinking_budget must be >= 0 (0 = off) and "
            f"answer_budget >= 1, got {it.thinking_budget} and {it.answer_budget}"
        )
    if not it.thinking_budget:
        return
    if not it.text:
        raise ValueError("rollout.interrupt.text must not be empty")
    if it.thinking_budget + it.answer_budget >= rollout.max_new_tokens:
        raise ValueError(
            f"rollout.interrupt: thinking_budget={it.thinking_budget} + "
            f"answer_budget={it.answer_budget} + the text's tokens must fit in "
            f"rollout.max_new_tokens={rollout.max_new_tokens}"
        )


def check_runtime(cfg: schema.Config, *, source: str = "<config>") -> None:
    """Raises ConfigError when this machine lacks what `cfg` needs to run (not to be planned:
    `rlvr-train --dry-run` skips it): the package `rollout.backend` needs (its capabilities'
    `package`, e.g. `vllm`)."""
    import importlib.util

    from rlvr_jax.rollout.capabilities import backend

    b = backend(cfg.rollout.backend)
    if b.package is not None and importlib.util.find_spec(b.package) is None:
        raise ConfigError(
            f"{source}: rollout.backend: {b.name} needs the {b.package} package, which is not "
            f"installed here; install {b.install}, or set rollout.backend: jetstream (our "
            "engine, runs everywhere)"
        )
