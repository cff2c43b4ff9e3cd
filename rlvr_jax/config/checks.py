"""The checks of a loaded config that span several keys, run by `rlvr_jax.config.load` before
any model or data is loaded (and by the trainer, for a `Config` built in Python): errors name
the key and the file.

`check` covers `rollout` (interrupt, push, what the backend cannot honour), `eval` against
`data.eval_sources`, `model.lora`, `env`, the `loss:` section with its preset, the
`algorithm`'s needs (`algorithm_checks`), the sources' mappings, and imports every
`module:function` of the config now (`config.refs`). `check_context` compares the prompt +
completion budget with the model's context when its config is at hand (`rlvr-train` after the
load, the trainer again once `model.create_if_missing` built it); `check_runtime` checks what
this machine must have to run a config. The rest is checked where model and data load.
"""

from __future__ import annotations

from rlvr_jax.config import schema
from rlvr_jax.config.refs import search_working_directory


class ConfigError(ValueError):
    """A config problem; the message names the key and where it came from."""


def check(cfg: schema.Config, *, source: str = "<config>") -> None:
    """Raises ConfigError (`<source>: <the key's problem>`) for the first failed check."""
    from rlvr_jax.config.algorithm_checks import check_algorithm
    from rlvr_jax.losses import loss_settings_from_config
    from rlvr_jax.rollout.api import refused

    search_working_directory()  # `module:function` may name a module beside the command
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
        check_algorithm(cfg)
        _check_sources(cfg)
        _check_env_refs(cfg.env)
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from None


def check_context(cfg: schema.Config, *, source: str = "<config>") -> None:
    """ConfigError when `data.max_prompt_len` + the completion budget exceeds the model's
    `max_position_embeddings`; nothing when the model's config is not at hand yet."""
    try:
        _check_context(cfg)
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from None


def _check_context(cfg: schema.Config) -> None:
    found = _model_positions(cfg.model)
    if found is None:
        return
    limit, where = found
    if cfg.algorithm == "dpo" and cfg.dpo.max_response_len is not None:
        budget, key = cfg.dpo.max_response_len, "dpo.max_response_len"
    else:
        budget, key = cfg.rollout.max_new_tokens, "rollout.max_new_tokens"
    total = cfg.data.max_prompt_len + budget
    if total > limit:
        raise ValueError(
            f"data.max_prompt_len={cfg.data.max_prompt_len} + {key}={budget} = {total} "
            f"positions exceed the model's max_position_embeddings={limit} ({where}): lower "
            "one of them"
        )


def _model_positions(model: schema.ModelConfig) -> tuple[int, str] | None:
    """(max_position_embeddings, where it was read) of `model.path`'s config.json, else of
    `model.hf_config`; None when neither gives it."""
    import json
    from pathlib import Path

    file = Path(model.path) / "config.json"
    hf, where = model.hf_config, "model.hf_config"
    if file.is_file():
        try:
            hf, where = json.loads(file.read_text()), str(file)
        except (OSError, ValueError):
            return None  # the model's loader names what is wrong with it
    value = hf.get("max_position_embeddings") if isinstance(hf, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value, where


def _source_lists(cfg: schema.Config) -> list[tuple[str, list[schema.SourceConfig]]]:
    return [
        ("data.sources", cfg.data.sources),
        ("data.eval_sources", cfg.data.eval_sources),
        ("sft.sources", cfg.sft.sources),
        ("dpo.sources", cfg.dpo.sources),
    ]


def _check_sources(cfg: schema.Config) -> None:
    """Each source's `fields` maps row fields, and its `verifier` and `answer_transform`
    resolve (a `module:function` one is imported)."""
    from rlvr_jax.config.refs import import_function, is_ref
    from rlvr_jax.data.mapping import answer_transform, check_fields

    for name, sources in _source_lists(cfg):
        for i, src in enumerate(sources):
            key = f"{name}[{i}]"
            check_fields(src.fields, f"{key}.fields")
            if src.verifier is not None:
                if not src.verifier.strip():
                    raise ValueError(f"{key}.verifier must not be empty")
                if is_ref(src.verifier):
                    import_function(src.verifier, f"{key}.verifier")
            if src.answer_transform is not None:
                answer_transform(src.answer_transform, f"{key}.answer_transform")


def _check_env_refs(env: schema.EnvConfig) -> None:
    """`env.name` resolves, and so does each of `env.tools` (a `module:function` tool is
    imported and its schema made from its signature)."""
    if env.name is None:
        return
    from rlvr_jax.config.refs import import_function, is_ref

    if is_ref(env.name):
        import_function(env.name, "env.name")
    else:
        from rlvr_jax.envs.base import env_factory

        env_factory(env.name)  # a registered name; the error names env.name
    if env.name != "tools":
        return
    from rlvr_jax.envs.tools import BUILTIN_TOOLS, make_tool

    for i, spec in enumerate(env.tools):
        key = f"env.tools[{i}]"
        if spec in BUILTIN_TOOLS:
            continue
        if not is_ref(spec):
            raise ValueError(
                f"{key}: {spec!r} is not one of {sorted(BUILTIN_TOOLS)} nor 'module:function'"
            )
        fn = import_function(spec, key)
        try:
            make_tool(fn, spec.partition(":")[2])
        except TypeError as e:
            raise ValueError(f"{key}: {e}") from None


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

    from rlvr_jax.rollout.api import backend

    b = backend(cfg.rollout.backend)
    if b.package is not None and importlib.util.find_spec(b.package) is None:
        raise ConfigError(
            f"{source}: rollout.backend: {b.name} needs the {b.package} package, which is not "
            f"installed here; install {b.install}, or set rollout.backend: jetstream (our "
            "engine, runs everywhere)"
        )
