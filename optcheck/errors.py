"""Errors that become one line on stderr and exit code 2 (``optcheck.exitcodes.USAGE``)."""


class InputError(Exception):
    """Bad input from the user: a file, an option value, a backend that cannot load.

    The message is the whole line shown to the user: it names the input and, where
    there is one, the command that fixes it.
    """
