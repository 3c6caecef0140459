"""Errors that cross module boundaries."""


class UsageError(Exception):
    """A mistake in how dralloc was invoked or configured (a flag, a variable, a missing config).

    Commands report it in one line on stderr and exit 2, never as a traceback.
    """
