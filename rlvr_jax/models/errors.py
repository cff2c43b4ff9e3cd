"""Named errors of the model family. All are `ValueError`s so config validation can catch them."""

from __future__ import annotations


class ModelConfigError(ValueError):
    """An HF config cannot be turned into an `ArchConfig` (missing or inconsistent field)."""


class UnsupportedArchitectureError(ModelConfigError):
    """The HF `model_type` / `architectures` is not one this package implements."""


class UnsupportedRopeError(ModelConfigError):
    """The checkpoint asks for a RoPE scaling type (or option) this package does not implement."""


class CheckpointError(ValueError):
    """A checkpoint directory is unreadable: no weights, a malformed index, a bad shape."""


class MissingTensorError(CheckpointError):
    """A tensor the architecture needs is absent from the checkpoint."""


class UnexpectedTensorError(CheckpointError):
    """The checkpoint holds tensors the architecture does not use (config and weights disagree)."""
