"""Errors that the entry point reports as one clear message (no traceback)."""


class GrammarRLError(Exception):
    """A user-facing error: bad config, missing data or weights, a run directory conflict."""


class ConfigError(GrammarRLError):
    """A config value is invalid; the message names the key."""


class DataError(GrammarRLError):
    """A data file or directory is missing, unreadable or malformed."""


class ModelError(GrammarRLError):
    """Model weights or an adapter cannot be found or do not fit."""
