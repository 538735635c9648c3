"""The drivers of a run: the soak supervisor (``soak.py``) and its worker process
(``worker_process.py``, ``worker_loop.py``, ``protocol.py``, ``watch.py``), and
``optcheck.Monitor`` inside a user's own loop (``monitor.py``, ``monitor_end.py``).
The distributed drivers live in ``optcheck/distributed/``."""
