"""Judging two runs: is the candidate the same run, a rerun within noise, a migration within
the seed band, or a regression?

- :mod:`~optcheck.judge.compare`: align two run directories and find where they first differ;
- :mod:`~optcheck.judge.verdict`: the verdict words (identical / within numerical noise /
  within the seed band / diverged) and their tolerances;
- :mod:`~optcheck.judge.policy`: rerun or migration (another backend, torch or libtorch);
- :mod:`~optcheck.judge.baseline`: the one regression policy (findings, loss band, CPU time
  per step, peak RSS) that ``soak --baseline`` and ``upgrade`` share;
- :mod:`~optcheck.judge.upgrade`: the same soak on two interpreters, plus the scenario matrix.
"""
