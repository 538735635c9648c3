"""``OptcheckCallback`` for Lightning (``lightning.pytorch``, 2.x).

One line for the user::

    from optcheck.integrations.lightning import OptcheckCallback

    trainer = L.Trainer(..., callbacks=[OptcheckCallback(every=50)])
    trainer.fit(model, data)                      # run dir: <default_root_dir>/optcheck

The Monitor starts at ``on_train_start`` (after the sanity-check validation, once
``configure_optimizers`` has run) on the optimizer ``trainer.optimizers[optimizer]``
and closes at ``on_train_end``; an exception that ends ``fit()`` is recorded as
the run's crash (``on_exception``). Steps are that optimizer's steps: with
``accumulate_grad_batches=N`` one step per N batches, with manual optimization
whenever ``training_step`` calls ``opt.step()`` (Lightning's ``LightningOptimizer``
forwards to the optimizer the hooks are on).

Several optimizers (a GAN): one is watched, ``trainer.optimizers[optimizer]``,
together with the smallest sub-module of the LightningModule that holds all its
parameters and none of the others' (``module="generator"`` names it yourself);
parameter names are then relative to that sub-module.
"""

from __future__ import annotations

import lightning.pytorch as pl

from optcheck.integrations._common import MonitorOwner


def _scope(root, optimizer, others) -> tuple[str, object]:
    """(name, module): the shallowest sub-module of ``root`` holding every parameter of
    ``optimizer`` and none of ``others``; ``root`` itself if there is no other optimizer."""
    mine = {id(p) for g in optimizer.param_groups for p in g["params"]}
    theirs = {id(p) for o in others for g in o.param_groups for p in g["params"]} - mine
    if not theirs:
        return "", root
    for name, mod in root.named_modules():  # pre-order: a parent before its children
        ids = {id(p) for p in mod.parameters()}
        if mine <= ids and not ids & theirs:
            return name, mod
    return "", root


class OptcheckCallback(MonitorOwner, pl.Callback):
    """A Lightning ``Callback`` running :class:`optcheck.Monitor` over ``fit()``.

    Args:
        out: run directory (default ``<trainer.default_root_dir>/optcheck``).
        optimizer: index in ``trainer.optimizers`` of the optimizer watched (default 0).
        module: attribute path of the sub-module watched (default: see the module
            docstring).
        **monitor_kwargs: :class:`optcheck.Monitor` arguments (``every``,
            ``fail_on``, ``on_finding``, ``ignore``, ``hazards`` ...).

    After ``fit()``: ``findings``, ``summary`` (``summary.json``'s fields) and
    ``exit_code`` (``optcheck.run.exitcodes``).

    Raises:
        IndexError: ``optimizer`` is past ``trainer.optimizers`` (at ``on_train_start``).
    """

    def __init__(self, out=None, *, optimizer: int = 0, module: str | None = None, **monitor_kwargs):
        MonitorOwner.__init__(self, out, **monitor_kwargs)
        self.optimizer_index, self.module_name = optimizer, module

    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if trainer.global_rank != 0:  # one run directory: the first process watches
            return
        opts = list(trainer.optimizers)
        if not 0 <= self.optimizer_index < len(opts):
            raise IndexError(f"OptcheckCallback(optimizer={self.optimizer_index}): the trainer has "
                             f"{len(opts)} optimizer(s)")
        opt = opts[self.optimizer_index]
        if self.module_name:
            model = pl_module.get_submodule(self.module_name)
        else:
            _, model = _scope(pl_module, opt, [o for o in opts if o is not opt])
        self._start(model, opt, trainer.default_root_dir)

    def on_train_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._finish()

    def on_exception(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException) -> None:
        self._finish(exception)
