"""
The project's error types, in one place. Every error a user can cause is a ``ProjectError``; its
message names the problem and the fix in one line, and ``cli.run_cli`` prints it as ``error: ...``
with a non-zero exit instead of a traceback.

model.py imports nothing from the project, so it raises plain ``ValueError`` for a bad GPTConfig;
the configurator and the checkpoint loader turn those into ``ConfigError`` / ``CheckpointError``.
"""
from __future__ import annotations


class ProjectError(Exception):
    """Base class of every error whose message is meant for the user (one line: the problem and the fix)."""


class ConfigError(ProjectError, ValueError):
    """A configuration value is missing, unknown or of the wrong type."""


class DataError(ProjectError, RuntimeError):
    """Data is missing or malformed, or belongs to another tokenizer than the model's."""


class CheckpointError(ProjectError, RuntimeError):
    """A checkpoint is missing, unreadable, not in nanoLGPT's format, or would be overwritten."""


class TransformError(ProjectError, ValueError):
    """A width transform that cannot be done as asked."""


class ConversionError(ConfigError):
    """A model that cannot be converted to or from Hugging Face as asked."""


class TrainingDiverged(ProjectError, RuntimeError):
    """The loss became NaN or infinite."""
