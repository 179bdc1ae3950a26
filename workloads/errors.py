"""Errors for bad input. The CLI prints their message as one line and exits 2."""


class ConfigError(ValueError):
    """A config, model, cluster, plan or spec the user gave is malformed or unknown.
    The message names the field (a dotted path where nested) and what is accepted."""
