"""``optcheck doctor``: what the two backends would run on here — .NET runtimes and
SDKs, pythonnet, torch (imported in a subprocess: a process that may load .NET must
never import torch, ``docs/dotnet.md``), the TorchSharp builds in the cache, threads."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import click


def torchsharp_builds() -> list[str]:
    """The TorchSharp worker builds in the cache (``optcheck.torchsharp_bridge.build``)."""
    from optcheck.torchsharp_bridge.build import cached_builds

    out = []
    for b in cached_builds():
        state = "ok" if b["ok"] else "no assembly (build failed?)"
        if b["ok"] and not b["current"]:
            state += ", stale: sources changed, rebuilt on next use"
        out.append(f"{b['torchsharp']}  [{state}] {b['assembly']} (SDK {b['sdk']}, built {b['built_at']})")
        if b["ok"]:
            out.append(f"  native library: {native_status(Path(b['assembly']).parent)}")
    return out


def native_status(folder: Path) -> str:
    """Whether TorchSharp's native library beside a worker build loads here
    (``optcheck.torchsharp_bridge.native``, in a subprocess: the doctor loads no libtorch)."""
    try:
        res = subprocess.run([sys.executable, "-m", "optcheck.torchsharp_bridge.native", str(folder)],
                             capture_output=True, text=True, errors="replace", timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        return f"not checked ({e})"
    text = (res.stdout.strip() or res.stderr.strip() or "no answer").splitlines()[-1]
    return text.removeprefix("ok ") + " loads" if res.returncode == 0 else text


def torch_version() -> str:
    """torch's version and threads, from a subprocess (never imported here)."""
    code = "import torch; print(torch.__version__, torch.get_num_threads())"
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, errors="replace",
                             timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        return f"unknown ({e})"
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["not importable"])[-1]
        return f"not available ({last}); install with: pip install 'torch>=2.1'"
    try:
        ver, threads = res.stdout.split()[-2:]
    except ValueError:
        return f"unknown (it printed {res.stdout.strip()[:80]!r})"
    from optcheck import torch_version as tv

    line = f"{ver} (intra-op threads by default: {threads})"
    problem = tv.problem(ver, True)
    return f"{line}; too old: {problem}" if problem else line


def clr_loader_missing() -> str:
    """Why ``clr_loader`` (pythonnet's loader, through which the runtimes are found)
    cannot be imported, or "" when it can. Without it no runtime can be found *or*
    loaded, which is not the same as no runtime being installed."""
    from optcheck.torchsharp_bridge import discovery

    try:
        import clr_loader  # noqa: F401
    except ImportError as e:
        return f"clr_loader (pythonnet's loader) is not importable ({e}); {discovery.PYTHONNET_HINT}"
    return ""


def report() -> list[tuple[str, list[str]]]:
    """Sections of the doctor's report as ``(title, lines)``. Never raises: a section
    that cannot be checked (an unreadable cache, a ``dotnet`` printing bytes that are
    not UTF-8, a ``build.json`` of another shape) says so in its own lines."""
    sections = [("python", [f"{platform.python_version()} ({sys.executable})",
                            f"cpus: {os.cpu_count()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"])]
    for part in (_dotnet_sections, _torch_section, _builds_section):
        try:
            sections += part()
        except Exception as e:  # noqa: BLE001 - the doctor reports what it could not check, it never fails
            title = {"_dotnet_sections": ".NET", "_torch_section": "torch",
                     "_builds_section": "TorchSharp builds"}[part.__name__]
            sections.append((title, [f"could not be checked: {type(e).__name__}: {str(e)[:200]}"]))
    return sections


def _dotnet_sections() -> list[tuple[str, list[str]]]:
    from optcheck.torchsharp_bridge import discovery, runtime

    sections = []
    no_loader = clr_loader_missing()
    core = discovery.coreclr_runtimes()
    lines = [f"{r.version}  [{r.root}] ({r.source})" for r in core] or [
        f"not checked: {no_loader}" if no_loader else "none found"]
    best = discovery.newest(core)
    if best is not None:
        lines.append(f"default: {best.version}, rolled forward (LatestMajor); invariant globalization: "
                     f"{'yes' if runtime.needs_invariant_globalization(best) else 'no'}")
    sections.append(("CoreCLR runtimes (Microsoft.NETCore.App)", lines))
    sections.append((".NET SDKs", discovery.dotnet_sdks() or ["none (the TorchSharp GPT worker cannot be built here)"]))
    mono = discovery.mono_runtime()
    if mono is None and no_loader:  # libmono is looked up through clr_loader: not known to be missing
        installed = discovery.mono_version()
        mono_lines = [(f"{installed} installed (`mono --version`); " if installed else "") + f"not checked: {no_loader}"]
    elif mono is None:
        mono_lines = [f"not found: {discovery.MONO_HINT}"]
    else:
        facade = discovery.mono_facade()
        mono_lines = [f"{mono.version or '?'}  [{mono.root}]",
                      f"netstandard facade: {facade}" if facade else
                      "netstandard facade missing (pythonnet cannot load Mono): apt-get install mono-devel"]
    sections.append(("Mono", mono_lines))
    pn = runtime.pythonnet_version()
    sections.append(("pythonnet", [pn if pn else f"not installed: {discovery.PYTHONNET_HINT}"]))
    return sections


def _torch_section() -> list[tuple[str, list[str]]]:
    return [("torch (checked in a subprocess)", [torch_version()])]


def _builds_section() -> list[tuple[str, list[str]]]:
    from optcheck.torchsharp_bridge.build import cache_root

    root = cache_root()
    try:
        lines = torchsharp_builds() or ["none"]
    except Exception as e:  # noqa: BLE001 - a cache of another shape is reported, not fatal
        lines = [f"could not be read: {type(e).__name__}: {str(e)[:200]}"]
    return [(f"TorchSharp builds in {str(root)[:200]}", lines)]


def register(group: click.Group) -> None:
    @group.command()
    def doctor():
        """Show the .NET runtimes and SDKs, pythonnet, torch and the cached TorchSharp
        builds that `optcheck soak` would use here. Always exits 0."""
        for title, lines in report():
            click.echo(f"{title}:")
            for ln in lines:
                click.echo(f"  {ln}")
        return 0
