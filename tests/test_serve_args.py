"""`rlvr-serve`'s command line without a server: its help, the positions per slot taken from
the model, the served model's name, and the model check of a request."""

import pytest

from rlvr_jax.serve.cli import build_parser, max_len, served_name
from rlvr_jax.serve.openai_api import BadRequest, ModelNotFound, check_model


def test_help_describes_the_command_in_whole_sentences():
    description = build_parser().description
    assert description.startswith("`rlvr-serve --model PATH`: the policy behind JetStream's")
    assert description.endswith("(`/v1/completions`, `/v1/chat/completions`, streaming).")


def test_positions_per_slot_come_from_the_model():
    assert build_parser().parse_args(["--model", "m"]).max_len is None
    assert max_len(None, 256) == 256
    assert max_len(128, 256) == 128
    with pytest.raises(ValueError, match=r"--max-len 2048: the model has max_position_embed"):
        max_len(2048, 256)


def test_served_name(tmp_path):
    run = tmp_path / "myrun"
    (run / "checkpoints" / "30" / "state").mkdir(parents=True)
    (tmp_path / "final").mkdir()
    assert served_name(str(run / "checkpoints" / "30"), None) == "myrun-step30"
    assert served_name(str(tmp_path / "final"), None) == "final"
    assert served_name(str(tmp_path / "final"), "policy") == "policy"


def test_a_request_for_another_model_is_not_found():
    check_model({"model": "m", "prompt": "x"}, ["m"])
    check_model({"prompt": "x"}, ["m"])  # naming none: the served one
    with pytest.raises(ModelNotFound, match=r"'gpt-4o' does not exist on this server; it serves"):
        check_model({"model": "gpt-4o"}, ["m"])
    assert issubclass(ModelNotFound, BadRequest)
