"""The run: one run directory, written by one recorder.

- ``recorder.py``: the only writer of a run: creates and locks the run directory,
  appends records, fills ``summary.json`` and picks the exit code;
- ``rundir.py``: the run directory's files, lock and reserve (``RunDir``);
- ``sequencer.py``: when a snapshot is taken, and what goes into it;
- ``snapshot.py`` / ``summary.py``: what a snapshot and ``summary.json`` hold;
- ``exitcodes.py``: the exit-code table and ``worst()``;
- ``record_check.py``: the cheap structural check of record lines.

Torch-free: every driver (``optcheck/drivers/``, ``optcheck/distributed/``) and
every reader uses it.
"""
