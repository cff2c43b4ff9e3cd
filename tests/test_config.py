"""The config system: schema validation, overrides, and errors that name the key and file."""

import dataclasses
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


def test_overrides_are_yaml_values(tmp_path):
    p = write(tmp_path, "model: {path: /m}\n")
    cfg = load(
        p,
        [
            "train.max_steps=3",
            "eval.ks=[1, 4, 16]",
            "rewards.domain_weights={math: 2, code: 0.5}",
            "loss.variant=my_pkg.losses:fancy",
            "train.learning_rate=1e-5",
            "rollout.temperature=0.7",
        ],
    )
    assert cfg.train.max_steps == 3
    assert cfg.eval.ks == [1, 4, 16]
    assert cfg.rewards.domain_weights == {"math": 2.0, "code": 0.5}
    assert cfg.loss.variant == "my_pkg.losses:fancy"
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
    undocumented = [k for k, _, doc in rows if not doc]
    assert undocumented == []


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
