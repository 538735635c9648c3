"""The PyTorch backend: GPT, training step, probe, hazard probes, scenarios, worker.

Where a PyTorch snapshot is taken: ``probe.py``. Importing this package imports
torch; nothing on a TorchSharp worker's path imports it.
"""
