"""One error family for everything a user can get wrong.

The CLI turns any `QvalError` into a one-paragraph message and exit code 2; anything
else is a bug in qval: exit code 2 too, "internal error, please report", and its traceback
saved to a file (the run folder's `crash-*.txt`), never printed on the console.
"""

from __future__ import annotations


class QvalError(Exception):
    """A problem the user can fix: the message says what, where, and what to do."""

    exit_code = 2


class ConfigError(QvalError):
    """The YAML config is malformed or names something that does not exist."""


class DataError(QvalError):
    """A dataset is missing, empty, malformed, or too small for what the config asks."""


class ModelError(QvalError):
    """The model cannot be found or loaded, or two models do not fit together."""


class BackendUnavailable(QvalError):
    """The configuration asks for hardware or a library this machine does not have."""


class StageError(QvalError):
    """A stage's stored output is unreadable or belongs to other inputs."""


class StorageError(QvalError):
    """The run folder cannot be written: a file where a folder should be, a read-only or full
    disk, or another qval run holding the folder."""
