"""Reading what ``dotnet build`` and NuGet print, for the TorchSharp worker build
(:mod:`optcheck.torchsharp_bridge.build`): the one line a failed build becomes, what each
package source offers for a missing version (NU1102), and the package versions a restore
really took (``obj/project.assets.json``). Torch-free; no .NET needed (tests feed it text)."""

from __future__ import annotations

import json
import re
from pathlib import Path

#: The NuGet package the worker references (dotnet/Worker/OptCheck.Worker.csproj).
PACKAGE = "TorchSharp-cpu"
NUGET_VERSIONS = "https://www.nuget.org/packages/TorchSharp-cpu#versions-body-tab"


def _first(lines: list[str], code: str) -> str | None:
    for ln in lines:
        if f"error {code}" in ln:
            return ln.split(f"error {code}:", 1)[-1].strip().rstrip(".").split(" [/")[0]
    return None


_FOUND_RE = re.compile(r"Found (\d+) version\(s\) in (.+?)(?: \[ Nearest version: ([^\s\]]+) \])?\s*$")


def sources_offer(output: str) -> str:
    """What NuGet's NU1102 says each package source offers, as one clause, e.g. ``nuget.org has
    64 versions (nearest 0.100.0), local has none``; "" when the output has no such lines.
    (NuGet prints one ``  - Found N version(s) in SOURCE [ Nearest version: V ]`` line per source.)"""
    parts = []
    for ln in output.splitlines():
        m = _FOUND_RE.search(ln.split("NU1102:", 1)[-1].strip())
        if not m:
            continue
        n, src, near = int(m.group(1)), m.group(2).strip(), m.group(3)
        part = f"{src} has none" if n == 0 else f"{src} has {n} version{'s' if n != 1 else ''}" + \
            (f" (nearest {near})" if near else "")
        if part not in parts:
            parts.append(part)
    return "the sources offer: " + ", ".join(parts) if parts else ""


def restored_versions(project: Path) -> dict[str, str]:
    """Package versions NuGet restored for ``project``, from ``obj/project.assets.json``
    (its ``libraries`` keys are ``Name/Version``): e.g. ``{"TorchSharp-cpu": "0.107.0",
    "TorchSharp": "0.107.0", ...}``; {} when the file is missing or unreadable."""
    try:
        assets = json.loads((project.parent / "obj" / "project.assets.json").read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    for key in (assets.get("libraries") or {}):
        name, _, version = key.partition("/")
        if name and version:
            out[name] = version
    return out


def explain_failure(output: str, spec, log: Path, cmd: list[str], suggest: str) -> str:
    """One line for a failed ``dotnet build`` (``output`` = its stdout + stderr) of ``spec``
    (a :class:`optcheck.torchsharp_bridge.build.Spec`): the cause (NU1101/NU1102 unknown
    package or version, NU1301 NuGet unreachable, the first compile or MSBuild error) and what
    to do; ``suggest`` is the version to propose instead."""
    lines = output.splitlines()
    shown = " ".join(cmd)
    what = f"{PACKAGE} {spec.version}" if spec.version else f"the worker against {spec.dll}"
    nu = _first(lines, "NU1102") or _first(lines, "NU1101")
    if nu and spec.version:
        offer = sources_offer(output)
        return (f"--torchsharp {spec.text}: NuGet has no {PACKAGE} {spec.version} (asked for exactly "
                f"[{spec.version}]); {offer or nu}; pick a published version ({NUGET_VERSIONS}), "
                f"e.g. `--torchsharp {suggest}`")
    nu = _first(lines, "NU1301")
    if nu:
        return (f"--torchsharp {spec.text}: cannot restore {what}: NuGet is unreachable ({nu}); connect this machine "
                f"to the network (or configure a NuGet source that has the packages) and run again, or build "
                f"TorchSharp locally and pass `--torchsharp PATH/TorchSharp.dll`")
    if nu := (_first(lines, "NU1102") or _first(lines, "NU1101")):
        return (f"--torchsharp {spec.text}: NuGet cannot find a dependency of the local TorchSharp build ({nu}); "
                f"put it beside {spec.dll} or connect to the network; log: {log}")
    err = next((ln.strip() for ln in lines if re.search(r"\berror [A-Z]{2,}\d+", ln)), None) \
        or next((ln.strip() for ln in lines if " error " in ln or ln.strip().lower().startswith("error")), None) \
        or (lines[-1].strip() if lines else "no output")
    err = re.sub(r"\s+\[[^\]]+\]$", "", err)  # MSBuild's trailing " [project.csproj]"
    return (f"--torchsharp {spec.text}: building the TorchSharp worker failed: {err}; full log: {log}; "
            f"re-run by hand: `{shown}`")
