"""``OptcheckCallback`` for the Hugging Face ``Trainer`` (transformers 5.x).

One line for the user::

    from optcheck.integrations.transformers import OptcheckCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[OptcheckCallback(every=50)])
    trainer.train()                               # run dir: <args.output_dir>/optcheck

The Monitor starts at ``on_train_begin`` on the Trainer's model and optimizer (an
accelerate ``AcceleratedOptimizer``: the ``torch.optim`` optimizer inside it is
watched, so with ``gradient_accumulation_steps=N`` one step is counted per N
micro-batches, as ``state.global_step`` counts) and closes at ``on_train_end``.
The Trainer has no exception callback: an exception that ends ``train()`` is
recorded when it ends the process (``sys.excepthook``), or by ``with`` around
``train()`` on the callback's ``monitor``.
"""

from __future__ import annotations

import transformers

from optcheck.integrations._common import MonitorOwner


class OptcheckCallback(MonitorOwner, transformers.TrainerCallback):
    """A ``TrainerCallback`` running :class:`optcheck.Monitor` over ``Trainer.train()``.

    Args:
        out: run directory (default ``<args.output_dir>/optcheck``).
        **monitor_kwargs: :class:`optcheck.Monitor` arguments (``every``,
            ``fail_on``, ``on_finding``, ``ignore``, ``hazards`` ...).

    After ``train()``: ``findings``, ``summary`` and ``exit_code``
    (``optcheck.run.exitcodes``).
    """

    def __init__(self, out=None, **monitor_kwargs):
        MonitorOwner.__init__(self, out, **monitor_kwargs)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if state.is_world_process_zero:  # one run directory: the first process watches
            self._start(model, optimizer, args.output_dir)

    def on_train_end(self, args, state, control, **kwargs):
        self._finish()
