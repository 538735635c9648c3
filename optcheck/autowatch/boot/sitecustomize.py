"""optcheck's start-up hook for ``optcheck run`` (coverage.py's subprocess mechanism).

``optcheck run`` puts this folder first on ``PYTHONPATH`` and the run's settings in
``OPTCHECK_RUN`` (JSON: ``out``, ``every``, ``hazards``, ``fail_on``, ``ignore``, ``root``);
every Python interpreter the command starts imports this ``sitecustomize`` at start-up
(``site.py``). It then:

1. runs the ``sitecustomize`` it shadows, if any (the next one on ``sys.path``), as
   that interpreter would have;
2. if ``OPTCHECK_RUN`` is set, waits for torch: torch already imported, the watch is
   installed now; else a finder first on ``sys.meta_path`` lets ``import torch`` run
   as it would and installs the watch once torch is initialised
   (:class:`optcheck.autowatch.attach.AutoWatch`), then leaves ``sys.meta_path``;
   ``atexit`` closes the watch (every Monitor's summary written).

A process that never imports torch (a shell's ``python -c``, a tokenizer pool) pays
for this module and one ``str`` comparison per import. Nothing here raises: an
error is one line on stderr and the program runs unwatched.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain() -> None:
    """Import the ``sitecustomize`` this one shadows (the next on ``sys.path``), as Python would."""
    import importlib.machinery
    import importlib.util

    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    mod = importlib.util.module_from_spec(spec)
    me = sys.modules.get("sitecustomize")
    sys.modules["sitecustomize"] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # noqa: BLE001 - as site.py: a failing sitecustomize is reported, not fatal
        sys.stderr.write(f"Error in sitecustomize ({spec.origin}); set PYTHONVERBOSE for traceback:\n"
                         f"{type(e).__name__}: {e}\n")
    finally:
        sys.modules["sitecustomize"] = me


def _install(config: str) -> None:
    """Install the watch in this process (torch is imported)."""
    try:
        import json

        cfg = json.loads(config)
        try:
            from optcheck.autowatch.attach import AutoWatch
        except ImportError:
            root = cfg.get("root")
            if not root:
                raise
            sys.path.append(root)  # (appended: never shadows the program's own modules)
            from optcheck.autowatch.attach import AutoWatch
        import atexit

        watch = AutoWatch(cfg.get("out"), every=int(cfg.get("every", 100)), hazards=cfg.get("hazards", "auto"),
                          fail_on=cfg.get("fail_on", "warning"), on_finding=cfg.get("on_finding", "warn"),
                          ignore=cfg.get("ignore") or None).install()
        atexit.register(watch.uninstall)
        sys.modules[__name__].watch = watch
    except Exception as e:  # noqa: BLE001 - the program runs unwatched, never stopped by optcheck
        sys.stderr.write(f"optcheck: the watch could not start in PID {os.getpid()} ({type(e).__name__}: {e}); "
                         f"this process runs unwatched\n")


class _TorchFinder:
    """First on ``sys.meta_path`` until torch is imported: wraps torch's loader so that the
    watch is installed right after ``torch/__init__.py`` ran, then steps aside."""

    def __init__(self, config: str):
        self.config = config

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader, self.config)
        return spec

    def invalidate_caches(self):
        pass


class _Loader:
    """Torch's own loader, then the watch; torch's ``__loader__``/``__spec__.loader`` put back."""

    def __init__(self, loader, config: str):
        self.loader, self.config = loader, config

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        try:
            self.loader.exec_module(module)
        finally:
            module.__loader__ = self.loader
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self.loader
        _install(self.config)

    def __getattr__(self, name):
        return getattr(self.loader, name)


def _boot() -> None:
    config = os.environ.get("OPTCHECK_RUN")
    if not config:
        return
    if "torch" in sys.modules:
        _install(config)
    else:
        sys.meta_path.insert(0, _TorchFinder(config))


try:
    _chain()
except Exception as e:  # noqa: BLE001
    sys.stderr.write(f"optcheck: the sitecustomize after optcheck's could not run ({type(e).__name__}: {e})\n")
_boot()
