"""A TFDS builder for the synthetic task family, built offline into a local `data_dir`.

    name = build_synthetic("data/tfds", n_train=2000, n_test=200)
    # SourceConfig(path=name, format="tfds", data_dir="data/tfds", split="train")

Features: `prompt`, `ground_truth` and `verifier_kwargs` (JSON text), `verifier`, `domain`;
splits `train` and `test`. The class is defined in `builder_class()` on first use, so importing
this module does not import TensorFlow. Each parameter set is its own builder config, named
after the parameters, so builds share a `data_dir` and read back without the class.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rlvr_jax.data.synthetic import DOMAINS, generate
from rlvr_jax.data.tasks_arithmetic import ArithmeticSpec
from rlvr_jax.data.tf_utils import import_tfds

DATASET_NAME = "rlvr_synthetic"
"""The TFDS name of the builder (the snake_case of its class name)."""

FEATURES = ("prompt", "ground_truth", "verifier", "domain", "verifier_kwargs")
"""Text features of every example; `ground_truth` and `verifier_kwargs` hold JSON."""


@functools.cache
def builder_class() -> type:
    """The `RlvrSynthetic` builder class (TFDS registers a builder name once per process,
    hence the cache)."""
    tfds = import_tfds()

    @dataclasses.dataclass(eq=False)
    class RlvrSyntheticConfig(tfds.core.BuilderConfig):
        """Parameters of one build of the synthetic family."""

        n_train: int = 2000
        n_test: int = 200
        seed: int = 0
        domains: tuple[str, ...] = DOMAINS
        level: int = 2

    class RlvrSynthetic(tfds.core.GeneratorBasedBuilder):
        """Synthetic verifiable prompts: arithmetic (`math`) and IFEval constraints."""

        VERSION = tfds.core.Version("1.0.0")
        RELEASE_NOTES = {"1.0.0": "Arithmetic and IFEval-constraint domains."}
        BUILDER_CONFIGS = [
            RlvrSyntheticConfig(name="default", description="2000 train / 200 test rows"),
            RlvrSyntheticConfig(name="tiny", n_train=64, n_test=16, description="for tests"),
        ]
        config_class = RlvrSyntheticConfig
        # The builder downloads nothing, so it has no checksums file next to its code. Saying
        # so also keeps TFDS (4.9) from importing `importlib_resources` to locate the code,
        # a package it needs on Python >= 3.9 but declares only for older Pythons.
        code_path = None

        def _info(self) -> Any:
            text = {name: tfds.features.Text() for name in FEATURES}
            return self.dataset_info_from_configs(features=tfds.features.FeaturesDict(text))

        def _split_generators(self, dl_manager: Any) -> dict[str, Any]:
            del dl_manager  # nothing is downloaded
            return {split: self._generate_examples(split) for split in ("train", "test")}

        def _generate_examples(self, split: str) -> Iterator[tuple[int, dict[str, str]]]:
            cfg = self.builder_config
            n = cfg.n_train if split == "train" else cfg.n_test
            spec = ArithmeticSpec.for_level(cfg.level)
            for i, row in enumerate(generate(split, n, cfg.seed, cfg.domains, arithmetic=spec)):
                yield i, example_from_row(row)

    return RlvrSynthetic


def example_from_row(row: dict[str, Any]) -> dict[str, str]:
    """A data row as a TFDS example: text features, JSON-encoded structured fields."""
    if not isinstance(row["prompt"], str):
        raise ValueError("TFDS examples hold text prompts; chat-message prompts are not supported")
    return {
        "prompt": row["prompt"],
        "ground_truth": json.dumps(row["ground_truth"], ensure_ascii=False),
        "verifier": row["verifier"],
        "domain": row.get("domain") or row["verifier"],
        "verifier_kwargs": json.dumps(row.get("verifier_kwargs") or {}, ensure_ascii=False),
    }


def config_name(n_train: int, n_test: int, seed: int, domains: Sequence[str], level: int) -> str:
    """The builder-config name of a parameter set, e.g. `s0_l2_n64x16_arithmetic_ifeval`."""
    return f"s{seed}_l{level}_n{n_train}x{n_test}_{'_'.join(domains)}"


def build_synthetic(
    data_dir: str | Path,
    *,
    n_train: int = 2000,
    n_test: int = 200,
    seed: int = 0,
    domains: Sequence[str] = DOMAINS,
    level: int = 2,
) -> str:
    """Builds the synthetic family into `data_dir` (offline; a no-op if already built) and
    returns the TFDS name (`rlvr_synthetic/<config>`) to read it with."""
    unknown = [d for d in domains if d not in DOMAINS]
    if unknown or not domains:
        raise ValueError(f"unknown or no domains {unknown or list(domains)}; known: {DOMAINS}")
    ArithmeticSpec.for_level(level)  # validates the level before TensorFlow is imported
    tfds = import_tfds()
    cls = builder_class()
    name = config_name(n_train, n_test, seed, domains, level)
    config = cls.config_class(
        name=name,
        n_train=n_train,
        n_test=n_test,
        seed=seed,
        domains=tuple(domains),
        level=level,
        description=f"{n_train} train / {n_test} test rows, seed {seed}, level {level}",
    )
    builder = cls(data_dir=str(data_dir), config=config)
    download_config = tfds.download.DownloadConfig(try_download_gcs=False)
    builder.download_and_prepare(download_config=download_config)
    return f"{DATASET_NAME}/{name}"
