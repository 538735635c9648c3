"""Errors that end a command with one line on stderr (no traceback).

:class:`InputError` is bad input: exit 2 (``optcheck.run.exitcodes.USAGE``).
:class:`RecordError` is a run directory that stopped taking writes (disk full,
file-size limit, I/O error): exit 4 (``optcheck.run.exitcodes.RECORD_FAILED``).
:class:`StepStopped` is raised into a training step on purpose (``optcheck.StepStopped``):
a hazard probe stopped it before harm was done.
"""

import errno


class InputError(Exception):
    """Bad input from the user: a file, an option value, a backend that cannot load.

    The message is the whole line shown to the user: it names the input and, where
    there is one, the command that fixes it.
    """


class RecordError(Exception):
    """A run directory file could not be written (``ENOSPC``, ``EFBIG``, ``EIO``...).

    Attributes:
        path: the file that failed.
        errno: the OS error number (``errno.ENOSPC`` = 28 for a full disk).

    The message is the whole line shown to the user: the path and the OS error.
    """

    def __init__(self, path, err: OSError):
        self.path, self.errno = str(path), err.errno
        super().__init__(f"cannot record to {path}: {err.strerror or err}"
                         + (f" ({errno.errorcode.get(err.errno, err.errno)})" if err.errno else ""))


class StepStopped(Exception):
    """Raised by a backend inside a step to stop it before harm is done (e.g. a
    saved tensor was written in place and backward would use it silently).

    Attributes:
        event: the schema-1 event describing why (goes into the next snapshot).
    """

    def __init__(self, message: str, event: dict):
        super().__init__(message)
        self.event = event
