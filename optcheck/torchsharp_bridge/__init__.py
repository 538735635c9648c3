"""TorchSharp backend, part 1: the pythonnet bridge. Torch-free (never imports torch).

- :mod:`runtime`  — find and load a .NET runtime (CoreCLR rolled forward, or Mono), load the worker assembly
- :mod:`convert`  — the .NET probe's flat arrays -> the backend part of a schema-1 snapshot
- :mod:`worker`   — ``python -m optcheck.torchsharp_bridge.worker --config CONFIG.json --stream-fd N``
- :mod:`fixtures` — the real TorchSharp records of ``tests/fixtures/torchsharp`` as schema-1 snapshots

The .NET side is ``dotnet/Probe/`` (``dotnet/README.md``).
"""
