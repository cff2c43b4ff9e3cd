"""The config system: schema validation, overrides, and errors that name the key and file."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr_jax.config import ConfigError, describe, dump, from_dict, load, replace, to_dict
from rlvr_jax.config.schema import Config

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "demo.yaml"


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.smoke("config")
def test_demo_config_loads_with_typed_sections():
    cfg = load(DEMO)
    assert isinstance(cfg, Config)
    assert cfg.loss.preset == "olmo3"
    assert cfg.rollout.mode == "async"
    assert cfg.model.hf_config["vocab_size"] > 0 and cfg.model.create_if_missing
    assert cfg.mesh.learner.fsdp == -1 and cfg.mesh.actor.data == -1  # schema defaults


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads_and_opens_with_its_command(path):
    load(path)
    first = path.read_text().splitlines()[:4]
    assert any("rlvr-train --config" in line for line in first), "configs open with their command"


def test_overrides_are_yaml_values(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # tests/user_losses.py
    p = write(tmp_path, "model: {path: /m}\n")
    cfg = load(
        p,
        [
            "train.max_steps=3",
            "eval.ks=[1, 4, 16]",
            "eval.num_samples=16",
            "rewards.domain_weights={math: 2, code: 0.5}",
            "loss.variant=user_losses:weighted_pg",
            "train.learning_rate=1e-5",
            "rollout.temperature=0.7",
        ],
    )
    assert cfg.train.max_steps == 3
    assert cfg.eval.ks == [1, 4, 16]
    assert cfg.rewards.domain_weights == {"math": 2.0, "code": 0.5}
    assert cfg.loss.variant == "user_losses:weighted_pg"
    assert cfg.train.learning_rate == pytest.approx(1e-5)  # YAML 1.1 reads "1e-5" as a string
    assert cfg.rollout.temperature == pytest.approx(0.7)


def test_unknown_key_names_key_file_and_close_match(tmp_path):
    p = write(tmp_path, "model: {path: /m}\ntrain:\n  max_step: 3\n")
    with pytest.raises(ConfigError) as e:
        load(p)
    msg = str(e.value)
    assert str(p) in msg and "train.max_step" in msg and "train.max_steps" in msg


def test_unknown_override_key_is_an_error(tmp_path):
    p = write(tmp_path, "model: {path: /m}\n")
    with pytest.raises(ConfigError, match=r"unknown key 'rollout\.temprature'.*temperature"):
        load(p, ["rollout.temprature=0.5"])


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("model: {path: /m}\ntrain: {max_steps: three}\n", r"train\.max_steps expects int"),
        ("model: {path: /m}\ntrain: {max_steps: 2.5}\n", r"train\.max_steps expects int"),
        ("model: {path: /m}\nlog: {plots: 1}\n", r"log\.plots expects bool"),
        ("model: {path: /m}\nrollout: {mode: asynch}\n", r"rollout\.mode must be one of.*'async'"),
        ("model: {path: /m}\neval: {ks: 8}\n", r"eval\.ks expects list"),
        ("model: {path: /m}\ndata: {sources: [{weight: 1}]}\n", r"data\.sources\[0\]\.path"),
        ("model: {path: /m}\ntrain: 5\n", r"train must be a mapping"),
        ("train: {max_steps: 1}\n", r"missing required value 'model\.path'"),
        ("- a\n- b\n", r"top level must be a mapping"),
        ("model: {path: /m\n", r"not valid YAML"),
    ],
)
def test_bad_values_name_the_key_and_file(tmp_path, text, pattern):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError, match=pattern) as e:
        load(p)
    assert str(p) in str(e.value)


def test_missing_file_and_bad_override_syntax(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load(tmp_path / "nope.yaml")
    p = write(tmp_path, "model: {path: /m}\n")
    with pytest.raises(ConfigError, match=r"expected key\.sub=value"):
        load(p, ["train.max_steps"])
    with pytest.raises(ConfigError, match=r"model\.path is not a section"):
        load(p, ["model.path.x=1"])


def test_dump_roundtrips(tmp_path):
    cfg = load(DEMO, ["train.max_steps=7"])
    again = load(write(tmp_path, dump(cfg)))
    assert again == cfg
    assert to_dict(again)["train"]["max_steps"] == 7


def test_replace_dotted():
    cfg = from_dict({"model": {"path": "/m"}})
    new = replace(cfg, **{"train.max_steps": 9, "seed": 3})
    assert (new.train.max_steps, new.seed, cfg.train.max_steps) == (9, 3, 10)


def test_every_field_has_a_docstring():
    rows = describe()
    assert len(rows) > 60
    undocumented = [k for k, _, _, doc in rows if not doc]
    assert undocumented == []


def test_describe_gives_defaults_and_the_keys_of_a_source():
    rows = {key: (tp, default, doc) for key, tp, default, doc in describe()}
    assert rows["model.path"][1] == "required"
    assert rows["rollout.num_samples"][:2] == ("int", "8")
    assert rows["rollout.mode"][1] == "sync" and rows["eval.ks"][1] == "[1, 8]"
    assert rows["model.tokenizer"][1] == "null" and rows["env.kwargs"][1] == "{}"
    assert rows["data.sources"][:2] == ("list[SourceConfig]", "[]")
    assert rows["data.sources[].path"][1] == "required"
    assert rows["data.sources[].fields"][0] == "dict[str, str]"
    assert rows["data.sources[].answer_transform"][1] == "null"
    assert "data.eval_sources[].path" not in rows  # written out once, at data.sources
    assert "keys of `data.sources[]`" in rows["data.eval_sources"][2]
    assert "keys of `data.sources[]`" in rows["dpo.sources"][2]


def test_configs_are_frozen():
    cfg = from_dict({"model": {"path": "/m"}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 1  # type: ignore[misc]


def test_nested_section_defaults_come_from_the_schema():
    # the actor mesh defaults to data=-1, the learner mesh to fsdp=-1; a partial section
    # overrides only the keys it names
    cfg = from_dict({"model": {"path": "/m"}})
    assert (cfg.mesh.actor.data, cfg.mesh.learner.fsdp) == (-1, -1)
    cfg = from_dict({"model": {"path": "/m"}, "mesh": {"actor": {"tensor": 2}}})
    assert (cfg.mesh.actor.data, cfg.mesh.actor.tensor, cfg.mesh.learner.fsdp) == (-1, 2, -1)
    cfg = load(None, ["model.path=/m", "mesh.learner.data=2"])
    assert (cfg.mesh.learner.data, cfg.mesh.learner.fsdp) == (2, -1)


# -- cross-field checks: at load, before any model or data -----------------------------------
@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        (["train.updates_per_batch=3"], r"train\.updates_per_batch=3 must divide the batch of 32"),
        (["train.micro_batch_size=3"], r"train\.micro_batch_size=3 must divide the mini-batch"),
        (["algorithm=sft", "sft.batch_size=0"], r"sft\.batch_size must be >= 1, got 0"),
        (["algorithm=rl_sft_parallel", "sft.batch_size=0"], r"sft\.batch_size must be >= 1"),
        (["algorithm=rl_sft_parallel", "loss.preset=ppo"], r"loss\.advantage: gae .* not rl_sft"),
        (["algorithm=expert_iteration", "sft.expert_min_score=0"], r"expert_min_score must be in"),
        (
            ["algorithm=expert_iteration", "sft.expert_sft_steps=0"],
            r"expert_sft_steps must be >= 1",
        ),
        (["loss.advantage=gae", "critic.lam=1.5"], r"critic\.lam must be in \[0, 1\], got 1\.5"),
        (["loss.preset=ppo", "critic.value_coef=0"], r"critic\.value_coef must be > 0"),
        (["loss.tis_mode=mask"], r"loss\.tis_\*: tis_mode='mask' needs tis_low"),
        (["loss.preset=olmo4"], r"loss\.preset: unknown loss preset 'olmo4'"),
        (["algorithm=dpo", "dpo.batch_size=0"], r"dpo\.batch_size must be >= 1"),
        (["algorithm=dpo", "dpo.max_response_len=1"], r"dpo\.max_response_len must be >= 2"),
        (["algorithm=dpo", "train.micro_batch_size=3"], r"micro_batch_size=3 must be even"),
        (["algorithm=dpo", "dpo.beta=0"], r"dpo\.variant / .*beta must be > 0"),
        (["algorithm=dpo", "dpo.variant=nope"], r"dpo\.variant / .*unknown preference loss"),
        (["algorithm=dpo", "dpo.variant_kwargs={label_smoothing: 0.7}"], r"label_smoothing"),
        (["mesh.num_devices=-1"], r"mesh\.num_devices must be >= 0"),
        (["eval.ks=[1, 16]"], r"eval\.ks: pass@16 needs 1 <= k <= eval\.num_samples=8"),
        (["eval.every_steps=10"], r"eval\.every_steps=10 evaluates on data\.eval_sources"),
    ],
)
def test_cross_field_checks_run_at_load_naming_key_and_file(tmp_path, overrides, pattern):
    p = write(
        tmp_path, "model: {path: /m}\ntrain: {prompts_per_batch: 4}\nrollout: {num_samples: 8}\n"
    )
    with pytest.raises(ConfigError, match=pattern) as e:
        load(p, overrides)
    assert str(p) in str(e.value)


def test_checks_follow_the_algorithm(tmp_path):
    # an RL mini-batch split means nothing to DPO, and critic.* nothing without a critic
    p = write(tmp_path, "model: {path: /m}\n")
    cfg = load(p, ["algorithm=dpo", "train.updates_per_batch=3", "critic.lam=1.5"])
    assert cfg.train.updates_per_batch == 3


def test_dry_run_reports_the_checks(tmp_path, capsys):
    from rlvr_jax import cli

    p = write(tmp_path, "model: {path: /nonexistent}\n")
    assert (
        cli.train_main(["--config", str(p), "--dry-run", "algorithm=sft", "sft.batch_size=0"]) == 2
    )
    err = capsys.readouterr().err
    assert str(p) in err and "sft.batch_size must be >= 1, got 0" in err


def test_a_config_built_in_python_is_checked_before_the_model_loads(tmp_path):
    from rlvr_jax.config import check
    from rlvr_jax.training.loop import Trainer

    cfg = replace(
        from_dict({"model": {"path": str(tmp_path / "absent")}}),
        **{"algorithm": "sft", "sft.batch_size": 0, "train.output_dir": str(tmp_path / "out")},
    )
    with pytest.raises(ConfigError, match=r"<config>: sft\.batch_size must be >= 1"):
        check(cfg)
    with pytest.raises(ConfigError, match=r"sft\.batch_size must be >= 1"):
        Trainer(cfg)  # not FileNotFoundError: the check comes before the model
    assert not (tmp_path / "out").exists()


def test_loading_starts_no_jax_backend():
    # `rlvr-train` loads the config before `jax.distributed.initialize`, which must come
    # before any backend starts: the checks trace (DPO's loss) but never run on a device
    code = (
        "from rlvr_jax.config import load\n"
        "from jax._src import xla_bridge\n"
        f"load({str(DEMO)!r}, ['algorithm=dpo'])\n"
        f"load({str(DEMO)!r}, ['loss.preset=ppo'])\n"
        "print(xla_bridge.backends_are_initialized())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
