"""The TorchSharp worker process: ``python -m optcheck.torchsharp_bridge.worker
--config CONFIG.json --stream-fd N``. Torch-free: it must never import torch
(PyTorch's libtorch and TorchSharp's share sonames, ``docs/dotnet.md``).

It loads a .NET runtime with pythonnet (:mod:`optcheck.torchsharp_bridge.runtime`),
the worker assembly ``cfg.torchsharp.assembly`` (which contains the
``OptCheck.Probe`` sources, ``dotnet/Probe/``), constructs the trainer
``cfg.torchsharp.trainer`` through ``OptCheck.Probe.Driver.ForType`` and runs
:func:`optcheck.drivers.worker_loop.run` with :class:`TorchSharpBackend`: one .NET call
per block of steps (``Driver.StepBlock``: the block's batches generated straight into
buffers bound with ``Driver.Bind``; after each step .NET takes the next pre-step
fingerprint and compares it with the last snapshot's, and writes the step's loss and
time beside the batches; the block ends after a step whose check fires, so the loop
snapshots before the next one as it would between single steps), one per snapshot
(``Driver.Probe``: the snapshot body as one JSON string, pre-step check included,
``docs/dotnet.md``). An assembly built from Probe sources without ``StepBlock`` is
stepped one call a step (``Driver.StepBound``).

:class:`optcheck.config.TorchSharpConfig` fields read here:

- ``runtime``: "coreclr" (default; newest installed, rolled forward) or "mono"
- ``dotnet_root``: look for CoreCLR only in this dotnet root
- ``assembly``: path of the worker assembly (required)
- ``trainer``: full type name of the ``ITrainer`` (default: the one trainer type the
  assembly holds, ``Driver.TrainerTypes``; the built-in worker's is :data:`DEFAULT_TRAINER`)
- the wire's ``extra`` (``SoakConfig.wire_extra()``: the trainer options and optcheck's own keys,
  ``dotnet_assembly``...) reaches the trainer's ``Setup`` JSON under ``extra`` (``extra.KEY``
  in ``TrainerOptions``, dotnet/Probe/TrainerOptions.cs).

**In-step check.** A trainer whose optimizer calls run the pre-step guard
(``ModuleTrainer``: its ``Optimizer`` is a ``GuardedOptimizer``; ``IGuardedTrainer``)
records what the check found inside the step, before the ``zero_grad()`` / ``step()``
it guards, with the snapshot body read at that moment. :meth:`TorchSharpBackend.in_step`
hands it to the loop, which sends it as a snapshot ``phase="in-step"`` at that step,
before the crash report of whatever TorchSharp then throws.

A .NET exception out of a step (``KeyNotFoundException`` from ``AdamW.step``)
is reported with its .NET type full name, message and .NET stack trace
(:meth:`TorchSharpBackend.exception_info`), and with what the pre-step and
disposed-member checks find on the live objects right after it (``diagnosis``:
the parameter behind the key, disposed members; "nothing to name" when all
agrees); ``Environment.FailFast`` kills the process with SIGABRT and the
supervisor reports that.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

from optcheck.config import SoakConfig
from optcheck.data import Corpus
from optcheck.errors import InputError
# (upward: this module is the TorchSharp worker process's entry point, itself a driver: it runs the soak loop)
from optcheck.drivers.protocol import Stream
from optcheck.drivers.worker_loop import run
from optcheck.run.backend import Backend
from optcheck.torchsharp_bridge import libtorch, native, runtime
from optcheck.torchsharp_bridge.convert import body_from_json, name_members

DEFAULT_TRAINER = "OptCheck.Worker.GptTrainer"
#: Most steps in one ``Driver.StepBlock`` call (the loop's metrics batch; a block also ends at the next snapshot,
#: injection, lifecycle event or held-out evaluation), and most bytes of its bound input buffers.
BLOCK_STEPS = 200
BLOCK_BYTES = 32 << 20
_SCALAR_FIELDS = ("steps", "every", "seed", "batch_size", "block_size", "n_layer", "n_head", "n_embd", "dropout",
                  "lr", "min_lr", "warmup_steps", "weight_decay", "beta1", "beta2", "eps", "grad_clip", "threads",
                  "run_id", "work_dir", "data", "device")


def setup_config(cfg: SoakConfig, corpus: Corpus) -> str:
    """The JSON object ``ITrainer.Setup`` receives (dotnet/Probe/Interfaces.cs): SoakConfig's
    scalar fields under their flat wire names, ``vocab_size`` from the corpus, and ``extra``
    (``SoakConfig.wire_extra()``; a value JSON cannot hold is written as its ``str``)."""
    wire = cfg.to_wire()
    doc: dict[str, Any] = {k: wire[k] for k in _SCALAR_FIELDS}
    doc["vocab_size"] = corpus.vocab_size
    doc["extra"] = dict(sorted(wire["extra"].items()))
    return json.dumps(doc, default=str)


class TorchSharpBackend(Backend):
    """:class:`optcheck.run.backend.Backend` over a .NET trainer driven through pythonnet."""

    name = "torchsharp"

    def __init__(self) -> None:
        self.driver = None
        self.rt: runtime.DotnetRuntime | None = None
        self._versions: dict[str, str] = {}
        self._threads = 1
        self._known: dict[int, str] = {}
        self._IntPtr = None
        # Driver.Bind buffers: inputs, targets (int64, capacity elements)
        self._xb = self._yb = None
        # the sink: the fingerprint after the last step, 1 when the in-step check found something during it, and
        # the steps the last StepBlock finished; and StepBlock's per-step losses and seconds
        self._fp = np.zeros(3, dtype=np.int64)
        self._losses = self._seconds = np.zeros(0)
        self._block_cap = 0
        self._in_step: dict | None = None  # {"step", "call", "body"} from Driver.TakeInStep, until in_step() takes it
        self._cap = 0
        self._fp_valid = False  # _fp holds the fingerprint after the last step and nothing has run since

    # -- setup ---------------------------------------------------------------------------
    def setup(self, cfg: SoakConfig, corpus: Corpus) -> None:
        ts = cfg.torchsharp
        kind = ts.runtime or "coreclr"
        asm_path = ts.assembly
        if not asm_path:
            if ts.version:
                raise InputError(f"--torchsharp {ts.version}: no worker assembly was built for it "
                                 f"(pass --dotnet-assembly PATH to a built worker, see dotnet/README.md)")
            raise InputError("the TorchSharp backend needs its .NET worker assembly: pass --torchsharp VERSION "
                             "or --dotnet-assembly PATH (see dotnet/README.md)")
        if not Path(asm_path).expanduser().is_file():
            raise InputError(f"--dotnet-assembly {asm_path}: no such file; build the worker assembly first "
                             f"(see dotnet/README.md)")
        framework = runtime.target_framework(Path(asm_path).expanduser())
        if kind == "mono" and framework and framework.startswith(".NETCoreApp"):
            raise InputError(f"--dotnet-runtime mono: {asm_path} is built for {framework} (the TorchSharp worker and "
                             f"projects like examples/torchsharp-own-model target net8.0), which Mono cannot load "
                             f"(TypeLoadException for System.AppDomain in System.Runtime 8.0); use --dotnet-runtime "
                             f"coreclr, the default")
        # TorchSharp's type initializer hides the loader's reason behind a TypeInitializationException:
        # load its native library first, and say what is missing (docs/torchsharp.md, "The native library")
        libtorch.load_native(Path(asm_path).expanduser().resolve().parent)
        self.rt = runtime.load(kind, ts.dotnet_root, config_dir=cfg.run.work_dir or None)
        assembly = runtime.load_assembly(asm_path)
        from System import IntPtr

        self._IntPtr = IntPtr
        Driver = runtime.internal_type(assembly, "OptCheck.Probe.Driver")  # internal: not importable
        if Driver is None:
            raise InputError(f"--dotnet-assembly {asm_path}: it does not contain OptCheck.Probe.Driver "
                             f"(include dotnet/Probe/*.cs in the worker project)")
        trainer = ts.trainer or ""
        try:
            self.driver = Driver.ForType(trainer)
        except Exception as e:  # noqa: BLE001 - .NET exceptions become one line
            if runtime.dotnet_type_name(e) == "System.ArgumentException" and not trainer:  # not exactly one trainer type
                raise InputError(f"--dotnet-assembly {asm_path}: {runtime.dotnet_message(e).strip()}") from None
            raise self._setup_error(e, asm_path, trainer) from None
        trainer = trainer or str(self.driver.Trainer.GetType().FullName)
        try:
            self.driver.Setup(setup_config(cfg, corpus))
        except Exception as e:  # noqa: BLE001 - .NET exceptions become one line
            raise self._setup_error(e, asm_path, trainer) from None
        tr = self.driver.Trainer
        self._threads = int(tr.Threads)
        self._versions = {"python": platform.python_version(), "pythonnet": runtime.pythonnet_version() or "",
                          "dotnet": runtime.runtime_description(), "dotnet_runtime": self.rt.kind}
        for pair in tr.Versions or []:
            k, _, v = str(pair).partition("=")
            if k and k not in ("dotnet", "dotnet_runtime", "python", "pythonnet"):
                self._versions[k] = v
        # TorchSharp's torch.__version__ names the libtorch its package pairs with, not the one loaded
        actual = libtorch.loaded_versions()
        declared = self._versions.get("libtorch")
        self._versions.update(actual)
        if declared and actual.get("libtorch", declared) != declared:
            self._versions["torchsharp_libtorch"] = declared

    @staticmethod
    def _setup_error(e: BaseException, asm_path: str, trainer: str) -> InputError:
        tname = runtime.dotnet_type_name(e) or type(e).__name__
        msg = runtime.dotnet_message(e).strip().splitlines()[0] if runtime.dotnet_message(e).strip() else ""
        inner = getattr(e, "InnerException", None)
        if tname == "System.Reflection.TargetInvocationException" and inner is not None:
            return TorchSharpBackend._setup_error(inner, asm_path, trainer)
        if tname == "System.DllNotFoundException":
            return InputError(runtime.native_library_hint(msg))
        if tname == "System.ArgumentException":
            return InputError(f"--dotnet-trainer {trainer}: {msg}")
        if tname in ("System.IO.FileNotFoundException", "System.IO.FileLoadException", "System.TypeLoadException",
                     "System.Reflection.ReflectionTypeLoadException", "System.BadImageFormatException"):
            return InputError(f"--dotnet-assembly {asm_path}: a dependency cannot be loaded ({tname}: {msg}); "
                              f"put the assemblies it references beside it")
        return InputError(f"the .NET trainer {trainer} failed to set up: {tname}: {msg}")

    # -- the Backend protocol ------------------------------------------------------------
    def versions(self) -> dict[str, str]:
        return dict(self._versions)

    def threads(self) -> int:
        return self._threads

    def inject(self, name: str, step: int) -> dict:
        self._fp_valid = False
        try:
            call = self.driver.Inject(name)
        except Exception as e:  # noqa: BLE001
            if runtime.dotnet_type_name(e) == "System.ArgumentException":
                raise InputError(f"--inject {name}@{step}: {runtime.dotnet_message(e)}") from None
            raise
        return {"call": str(call)}

    def lifecycle(self, kind: str, step: int) -> dict:
        self._fp_valid = False
        try:
            return {"call": str(self.driver.Lifecycle(kind))}
        except Exception as e:  # noqa: BLE001
            if runtime.dotnet_type_name(e) == "System.NotSupportedException":
                raise InputError(f"the .NET trainer has no lifecycle event {kind!r}: {runtime.dotnet_message(e)}") from None
            raise

    def fingerprint(self) -> int:
        """ProbeCore.Fingerprint: the value the last step wrote (StepBound computes it after the step)
        while nothing else has run on the .NET side since, else a fresh call."""
        if self._fp_valid:
            return int(self._fp[0])
        return int(self.driver.Fingerprint())

    def _ptrs(self, x: np.ndarray, y: np.ndarray):
        x = np.ascontiguousarray(x, dtype=np.int64)
        y = np.ascontiguousarray(y, dtype=np.int64)
        if x.shape != y.shape or x.ndim != 2:
            raise ValueError(f"inputs {x.shape} and targets {y.shape} must be equal (B, T) arrays")
        return x, y, self._IntPtr(x.ctypes.data), self._IntPtr(y.ctypes.data)

    def _bind(self, n: int) -> None:
        self._xb = np.empty(n, dtype=np.int64)
        self._yb = np.empty(n, dtype=np.int64)
        self._cap = n
        self.driver.Bind(self._IntPtr(self._xb.ctypes.data), self._IntPtr(self._yb.ctypes.data), n,
                         self._IntPtr(self._fp.ctypes.data))

    def train_step(self, step: int, x, y) -> float:
        if np.shape(x) != np.shape(y) or np.ndim(x) != 2:
            raise ValueError(f"inputs {np.shape(x)} and targets {np.shape(y)} must be equal (B, T) arrays")
        b, t = x.shape
        n = b * t
        if n > self._cap:
            self._bind(n)
        self._xb[:n] = np.ravel(x)  # into the bound buffers: no IntPtr objects, no array marshalling per step
        self._yb[:n] = np.ravel(y)
        return float(self._stepping(self.driver.StepBound, step, b, t))

    def _stepping(self, call, *args):
        """``call(*args)`` (StepBound, StepBlock): the sink's fingerprint is valid after it; what the in-step check
        found during it is taken, also when it throws."""
        self._fp_valid = False
        try:
            out = call(*args)
        except BaseException:
            self._take_in_step()
            raise
        self._fp_valid = True
        if self._fp[1]:
            self._take_in_step()
        return out

    def max_block(self, b: int, t: int) -> int:
        """Steps one :meth:`train_block` call may take with (B, T) batches: up to :data:`BLOCK_STEPS`, fewer when
        their buffers would pass :data:`BLOCK_BYTES`; 0 when the assembly's Driver has no ``StepBlock`` (Probe
        sources older than it: the loop then calls :meth:`train_step` per step)."""
        if not hasattr(self.driver, "StepBlock"):
            return 0
        return max(1, min(BLOCK_STEPS, BLOCK_BYTES // (16 * b * t)))

    def block_inputs(self, count: int, b: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets): two (count, B, T) int64 arrays over the bound buffers, for the caller to fill
        with the batches of the next :meth:`train_block`."""
        n = count * b * t
        if n > self._cap or count > self._block_cap:
            self._bind(max(n, self._cap))
            self._losses = np.empty(max(count, self._block_cap), dtype=np.float64)
            self._seconds = np.empty_like(self._losses)
            self._block_cap = self._losses.size
            self.driver.BindBlock(self._IntPtr(self._losses.ctypes.data), self._IntPtr(self._seconds.ctypes.data),
                                  self._block_cap)
        return self._xb[:n].reshape(count, b, t), self._yb[:n].reshape(count, b, t)

    def train_block(self, first: int, count: int, b: int, t: int, reference: int, budget_s: float) -> int:
        """Steps ``first``.. on the batches :meth:`block_inputs` holds, in one .NET call (``Driver.StepBlock``):
        it stops after a step whose fingerprint is not ``reference`` (the fingerprint of the last snapshot: the
        next step's pre-step check fires), after a step in which the in-step check found something, after
        ``budget_s`` seconds, or after ``count`` steps. Returns the steps done; their losses and seconds are
        :meth:`block_results`. A step's exception propagates with :meth:`block_done` steps done before it."""
        self._fp[2] = 0
        return int(self._stepping(self.driver.StepBlock, first, count, b, t, reference, budget_s))

    def block_done(self) -> int:
        """Steps the last :meth:`train_block` finished (also when one of its steps threw)."""
        return int(self._fp[2])

    def block_results(self, n: int) -> tuple[list[float], list[float]]:
        """Losses and step seconds of the first ``n`` steps of the last :meth:`train_block`."""
        return self._losses[:n].tolist(), self._seconds[:n].tolist()

    def _take_in_step(self) -> None:
        try:
            text = str(self.driver.TakeInStep())
        except Exception:  # noqa: BLE001 - a report that cannot be read is no report
            return
        if text:
            self._in_step = json.loads(text)

    def in_step(self) -> bool:
        """True when the in-step check found something during the last step: the next
        :meth:`snapshot_body` is the body it read then (before the optimizer call it guards)."""
        return self._in_step is not None

    def val_loss(self, batches: list) -> float | None:
        """Mean held-out loss; None when the trainer has no held-out evaluation (EvalLoss returns NaN,
        ModuleTrainer's default), so that the report shows none instead of ``nan``."""
        self._fp_valid = False
        losses = []
        for x, y in batches:
            x, y, px, py = self._ptrs(x, y)
            losses.append(float(self.driver.EvalLoss(px, py, x.shape[0], x.shape[1])))
        if losses and all(math.isnan(v) for v in losses):
            return None
        return float(np.mean(losses)) if losses else math.nan

    def has_events(self) -> bool:
        return False

    def snapshot_body(self) -> dict:
        self._fp_valid = False
        if self._in_step is not None:
            report, self._in_step = self._in_step, None
            body = body_from_json(json.dumps(report["body"]))
            name_members(body, self._known)
            body["events"] = []
            return body
        body = body_from_json(str(self.driver.Probe()))
        name_members(body, self._known)
        body["events"] = []
        return body

    def exception_info(self, exc: BaseException) -> dict:
        tname = runtime.dotnet_type_name(exc)
        if tname is None:
            return {}
        stack = str(getattr(exc, "StackTrace", "") or "")
        inner = getattr(exc, "InnerException", None)
        while inner is not None:
            stack += f"\n --- inner {inner.GetType().FullName}: {inner.Message}\n{inner.StackTrace or ''}"
            inner = inner.InnerException
        first = next((ln.strip() for ln in stack.splitlines() if ln.strip()), "")
        message = runtime.dotnet_message(exc)
        diagnosis = self.crash_diagnosis(message)
        if diagnosis:
            message = f"{message} [optcheck, on the live objects after it: {'; '.join(diagnosis)}]"
        return {"exc_type": tname, "message": message, "stack": stack,
                "where": first.removeprefix("at ").strip() or None, "dotnet": True, "diagnosis": diagnosis}

    def crash_diagnosis(self, message: str) -> list[str]:
        """``Driver.CrashDiagnosis``: the pre-step and disposed-member checks run once more on the live
        model and optimizer after an exception escaped the step, one line per finding (the parameter whose
        handle is a KeyNotFoundException's key, disposed members), or one line saying there is nothing to
        name; [] when there is no driver."""
        if self.driver is None:
            return []
        try:
            text = str(self.driver.CrashDiagnosis(message))
        except Exception as e:  # noqa: BLE001 - never let the diagnosis hide the crash
            return [f"the live model and optimizer could not be checked: {e}"]
        return [ln for ln in text.splitlines() if ln.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m optcheck.torchsharp_bridge.worker",
                                 description="optcheck's TorchSharp worker (run by `optcheck soak --backend torchsharp`).")
    ap.add_argument("--config", required=True, help="SoakConfig JSON file")
    ap.add_argument("--stream-fd", type=int, default=None, help="file descriptor of the pipe to the supervisor")
    args = ap.parse_args(argv)
    stream = Stream(args.stream_fd)
    try:
        cfg = SoakConfig.from_json(Path(args.config).read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError) as e:
        msg = f"--config {args.config}: cannot read a soak configuration ({e})"
        stream.send("crash", step=0, exc_type="InputError", message=msg, stack="", input_error=True)
        stream.close()
        print(f"optcheck: error: {msg}", file=sys.stderr)
        return 2
    return run(TorchSharpBackend(), cfg, stream)


if __name__ == "__main__":
    sys.exit(main())
