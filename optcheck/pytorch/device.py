"""What a run's device is, in words, and what it held when it ran out of memory.

:func:`describe` names the device the soak or the Monitor trains on, for the snapshots'
and the summary's ``versions`` (docs/summary.md): on CUDA the card's name
(``torch.cuda.get_device_name``), its compute capability
(``torch.cuda.get_device_capability``), the CUDA version torch was built with
(``torch.version.cuda``) and the driver's version (NVML, ``nvidia-ml-py``, where it is
installed; else left out). :func:`oom_report` is what a worker's crash carries when the
step ran out of memory (docs/gpu.md, "Out of memory").
"""

from __future__ import annotations

import functools

import torch

GiB = 2**30


@functools.lru_cache(maxsize=None)
def _cuda(index: int) -> dict[str, str]:
    out = {"device": f"cuda:{index} {torch.cuda.get_device_name(index)}",
           "cuda_capability": "{}.{}".format(*torch.cuda.get_device_capability(index)),
           "cuda": str(torch.version.cuda)}
    driver = _driver_version()
    if driver:
        out["cuda_driver"] = driver
    return out


def _driver_version() -> str | None:
    """The NVIDIA driver's version from NVML (``pynvml``), None where it cannot be read."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:  # noqa: BLE001 - not installed, no driver, no permission: just not named
        return None


def describe(device: torch.device | str | None) -> dict[str, str]:
    """``{"device": "cpu"}``, or on CUDA ``{"device": "cuda:0 NVIDIA H100 80GB HBM3",
    "cuda_capability": "9.0", "cuda": "13.0", "cuda_driver": "580.159.04"}`` (strings,
    cached per device; ``cuda_driver`` only where NVML answers)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type != "cuda":
        return {"device": str(dev)}
    try:
        return dict(_cuda(dev.index if dev.index is not None else torch.cuda.current_device()))
    except Exception:  # noqa: BLE001 - a broken CUDA context: name what is known
        return {"device": str(dev)}


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (the CPU for a model without any)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def is_oom(exc: BaseException) -> bool:
    """True for an allocation that failed: ``torch.OutOfMemoryError`` (CUDA's caching
    allocator, torch >= 2.5; ``torch.cuda.OutOfMemoryError`` before), or the CPU
    allocator's ``RuntimeError`` ("DefaultCPUAllocator: can't allocate memory")."""
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        "can't allocate memory" in str(exc) or "out of memory" in str(exc).lower())


def _gib(n) -> str:
    return f"{n / GiB:.2f} GiB"


def oom_report(exc: BaseException, device: torch.device, trail: list[dict]) -> dict:
    """The crash's ``oom`` record: the device, what its allocator held when the step failed
    (CUDA: ``torch.cuda.memory_stats``; CPU: the process's RSS), the memory of the last
    snapshots before it (``trail``: ``{"after_step", <snapshot memory fields>}``), which
    fields rose over them, and one sentence saying so."""
    from optcheck.pytorch import probe

    rec: dict = {"device": str(device)}
    if device.type == "cuda" and torch.cuda.is_available():
        try:
            rec.update(probe.device_memory([torch.cuda.memory_stats(device)]))
        except Exception:  # noqa: BLE001
            pass
    else:
        import psutil

        rec["rss_bytes"] = psutil.Process().memory_info().rss
    rec["before"] = list(trail)
    rose = {}
    if len(trail) >= 2:
        first, last = trail[0], trail[-1]
        rose = {k: last[k] - first[k] for k, v in last.items()
                if k.endswith("_bytes") and isinstance(v, int) and isinstance(first.get(k), int)
                and last[k] > first[k]}
    rec["rose"] = rose
    held = (f"{_gib(rec['device_allocated_bytes'])} allocated, {_gib(rec['device_reserved_bytes'])} reserved "
            f"on {device}" if "device_allocated_bytes" in rec else f"RSS {_gib(rec['rss_bytes'])}")
    if rose and len(trail) >= 2:
        span = f"steps {trail[0]['after_step']}-{trail[-1]['after_step']}"
        what = ", ".join(f"{k.removesuffix('_bytes')} +{_gib(v)}" for k, v in sorted(rose.items(),
                                                                                  key=lambda kv: -kv[1])[:3])
        before = f"; over the last {len(trail)} snapshots ({span}) {what}"
    elif trail:
        before = f"; nothing rose over the last {len(trail)} snapshot(s): one step's peak did not fit"
    else:
        before = "; no snapshot was taken before it"
    rec["summary"] = f"out of memory at this step: {held}{before}"
    return rec
