"""The project's errors. For bad configuration: a ``ValueError`` whose message names the flag to fix.

The command line prints it as one line (``error: --data.group_size must be >= 2 ...``) and exits with status 2
instead of a traceback; library callers get an ordinary ``ValueError`` subclass.
"""


class ConfigError(ValueError):
    """A configuration value or combination is invalid; the message names the flag."""


class TrainingStopped(RuntimeError):
    """Training cannot go on (e.g. every optimizer step of a network is being skipped); the message says why and
    which flags to check. The command line prints it as one line and exits with status 1."""
