"""Watching a program nobody edited: ``optcheck run -- COMMAND`` and ``pytest --optcheck``.

- :mod:`optcheck.autowatch.attach`: :class:`~optcheck.autowatch.attach.AutoWatch`, torch's global
  optimizer-step and module-forward hooks, an ``optcheck.Monitor`` opened for each optimizer at its
  first step over the model whose forward ran;
- ``optcheck/autowatch/boot/sitecustomize.py``: the start-up hook every interpreter of the command
  runs (``OPTCHECK_RUN`` set): installs an AutoWatch when the process imports torch;
- :mod:`optcheck.autowatch.launch`: the launcher (``optcheck run``): the child, its signals, the fold.

Mechanism and limits: ``docs/guide/run.md``.
"""
