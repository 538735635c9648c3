"""optcheck: soak tester and consistency checker for deep-learning optimizers.

Importing ``optcheck`` does not import torch (a TorchSharp worker imports this
package, and torch must never share its process). ``optcheck.Monitor`` loads the
PyTorch side on first use.
"""

__version__ = "0.1.0"


#: What a Monitor user catches or filters, importable from here: ``optcheck.FindingError``
#: (``on_finding="raise"``), ``optcheck.StepStopped`` (a hazard stopped the step),
#: ``optcheck.OptcheckWarning`` (``on_finding="warn"``). Loaded with the Monitor, on first use.
_MONITOR_NAMES = ("Monitor", "FindingError", "StepStopped", "OptcheckWarning")


def __getattr__(name):
    if name in _MONITOR_NAMES:
        from optcheck.drivers import monitor

        return getattr(monitor, name)
    raise AttributeError(f"module 'optcheck' has no attribute {name!r}")


__all__ = [*_MONITOR_NAMES, "__version__"]
