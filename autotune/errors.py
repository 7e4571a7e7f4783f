"""Errors a user can cause: each carries a one-line sentence naming the bad value and what works."""

from __future__ import annotations


class AutotuneError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""


class ConfigError(AutotuneError):
    """A training configuration or option that cannot be accepted."""


class WorkloadError(AutotuneError):
    """The user's model, data or loss could not be loaded or used."""
