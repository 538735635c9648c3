"""optcheck: soak tester and consistency checker for deep-learning optimizers.

Importing ``optcheck`` does not import torch (a TorchSharp worker imports this
package, and torch must never share its process). ``optcheck.Monitor`` loads the
PyTorch side on first use.
"""

__version__ = "0.1.0"


def __getattr__(name):
    if name == "Monitor":
        from optcheck.monitor import Monitor

        return Monitor
    raise AttributeError(f"module 'optcheck' has no attribute {name!r}")


__all__ = ["Monitor", "__version__"]
