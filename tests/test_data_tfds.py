"""The TFDS builder, built offline into tmp_path and read back through the TFDS source."""

import json
import os
import subprocess
import sys

import pytest

from rlvr_jax.config.schema import SourceConfig
from rlvr_jax.data import synthetic
from rlvr_jax.data.rows import DataError
from rlvr_jax.data.sources import load_source
from rlvr_jax.data.tasks_arithmetic import ArithmeticSpec
from rlvr_jax.data.tfds_builder import build_synthetic, example_from_row

pytestmark = pytest.mark.slow  # importing TensorFlow alone takes ~3 s on 2 cores

N_TRAIN, N_TEST, SEED = 40, 12, 3


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tfds")
    return data_dir, build_synthetic(data_dir, n_train=N_TRAIN, n_test=N_TEST, seed=SEED, level=1)


def as_set(rows):
    return {
        (r["prompt"], json.dumps(r["ground_truth"], sort_keys=True), r["verifier"], r["domain"])
        for r in rows
    }


@pytest.mark.parametrize(("split", "n"), [("train", N_TRAIN), ("test", N_TEST)])
def test_built_dataset_reads_back_as_the_generated_rows(built, split, n):
    data_dir, name = built
    assert name == "rlvr_synthetic/s3_l1_n40x12_arithmetic_ifeval"
    src = load_source(SourceConfig(path=name, format="tfds", data_dir=str(data_dir), split=split))
    assert src.name == name and src.num_skipped == 0
    expected = synthetic.generate(split, n, SEED, arithmetic=ArithmeticSpec.for_level(1))
    assert as_set(r.to_dict() for r in src.rows) == as_set(expected)
    assert {r.verifier for r in src.rows} == {"math", "ifeval"}


def test_rebuild_is_a_no_op(built):
    data_dir, name = built
    files = sorted(p for p in data_dir.rglob("*") if p.is_file() and "tfrecord" in p.name)
    mtimes = [os.stat(p).st_mtime_ns for p in files]
    assert build_synthetic(data_dir, n_train=N_TRAIN, n_test=N_TEST, seed=SEED, level=1) == name
    assert [os.stat(p).st_mtime_ns for p in files] == mtimes


def test_fresh_process_reads_from_files_without_the_builder_code(built):
    data_dir, name = built
    code = (
        "import json; from rlvr_jax.config.schema import SourceConfig; "
        "from rlvr_jax.data.sources import load_source; "
        f"src = load_source(SourceConfig(path={name!r}, format='tfds', data_dir={str(data_dir)!r}, split='test')); "
        "print(json.dumps([r.to_dict() for r in src.rows])); "
        "from rlvr_jax.data.tfds_builder import builder_class; "
        "assert builder_class.cache_info().currsize == 0  # the builder class was never defined"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert as_set(rows) == as_set(
        synthetic.generate("test", N_TEST, SEED, arithmetic=ArithmeticSpec.for_level(1))
    )


def test_missing_dataset_split_and_unprepared_data_dir(built, tmp_path):
    data_dir, name = built
    with pytest.raises(DataError, match=r"'no_such_dataset'.*not found"):
        load_source(SourceConfig(path="no_such_dataset", format="tfds", data_dir=str(data_dir)))
    with pytest.raises(DataError, match="has no split 'validation'"):
        load_source(
            SourceConfig(path=name, format="tfds", data_dir=str(data_dir), split="validation")
        )
    with pytest.raises(DataError, match="not prepared"):  # a known builder config, nothing built
        load_source(SourceConfig(path="rlvr_synthetic/tiny", format="tfds", data_dir=str(tmp_path)))


def test_tensorflow_sees_no_accelerators():
    from rlvr_jax.data.tf_utils import import_tensorflow

    tf = import_tensorflow()
    assert tf.config.get_visible_devices("GPU") == []
    assert tf.config.get_visible_devices("TPU") == []
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] in {"1", "2", "3"}


def test_late_import_warns_when_devices_cannot_be_hidden(monkeypatch, caplog):
    """If TensorFlow's runtime started before us, hiding devices fails: say so, don't crash."""
    from rlvr_jax.data import tf_utils

    tf = tf_utils.import_tensorflow()

    def already_initialised(devices, device_type):
        raise RuntimeError("Visible devices cannot be modified after being initialized")

    monkeypatch.setattr(tf.config, "set_visible_devices", already_initialised)
    with caplog.at_level("WARNING", logger="rlvr_jax.data.tf_utils"):
        assert tf_utils.import_tensorflow.__wrapped__() is tf
    assert [r.getMessage().split(" devices")[0][-3:] for r in caplog.records] == ["GPU", "TPU"]
    assert "may hold accelerator memory" in caplog.records[0].getMessage()


def test_example_encoding():
    row = {
        "prompt": "p",
        "ground_truth": {"instruction_id": ["x"], "kwargs": [{}]},
        "verifier": "ifeval",
    }
    assert example_from_row(row) == {
        "prompt": "p",
        "ground_truth": '{"instruction_id": ["x"], "kwargs": [{}]}',
        "verifier": "ifeval",
        "domain": "ifeval",
        "verifier_kwargs": "{}",
    }
    with pytest.raises(ValueError, match="chat-message prompts"):
        example_from_row({**row, "prompt": [{"role": "user", "content": "p"}]})
    with pytest.raises(ValueError, match="unknown or no domains"):
        build_synthetic("/nonexistent", domains=["poetry"])
