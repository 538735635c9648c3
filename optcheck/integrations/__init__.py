"""One-line integrations of :class:`optcheck.Monitor` with training frameworks.

- ``optcheck.integrations.lightning.OptcheckCallback``: a Lightning
  (``lightning.pytorch``) ``Callback``;
- ``optcheck.integrations.transformers.OptcheckCallback``: a Hugging Face
  ``transformers.TrainerCallback``.

Each starts a Monitor when training starts and closes it when training ends,
writing the same run directory (``snapshots.jsonl``, ``findings.jsonl``,
``summary.json``) and keeping the same exit-code policy (``fail_on``): the
callback's ``exit_code`` is the Monitor's. Neither module is imported by
``import optcheck``; each imports its framework (pip extra ``integrations``).
"""
