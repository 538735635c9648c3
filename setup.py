"""Ship the TorchSharp worker's C# sources in the wheel (everything else is in pyproject.toml).

The C# lives once, in the checkout's ``dotnet/`` folder (``dotnet/Probe/*.cs``,
``dotnet/Contract/**/*.cs``, ``dotnet/Worker/*.cs`` and ``OptCheck.Worker.csproj``): the project folder a C# user opens and
builds by hand. When a wheel is built, ``build_py`` copies those files into the package as
``optcheck/dotnet_src/{Probe,Contract,Worker}/``, where an installed optcheck builds the worker from
(optcheck/torchsharp_bridge/build.py ``sources_dir``). An editable install skips the copy and
keeps reading ``dotnet/``, so there is never a second copy in git.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
#: (folder under dotnet/, file patterns) shipped as optcheck/dotnet_src/<folder>/
CSHARP = (("Probe", ("*.cs",)), ("Contract", ("*.cs",)), ("Contract/TorchSharp", ("*.cs",)),
          ("Worker", ("*.cs", "*.csproj")))


def csharp_sources() -> list[tuple[Path, str]]:
    """(source file, path relative to dotnet/) for every shipped C# file."""
    out = []
    for folder, patterns in CSHARP:
        for pat in patterns:
            out += [(f, f"{folder}/{f.name}") for f in sorted((HERE / "dotnet" / folder).glob(pat))]
    return out


class BuildPyWithCSharp(build_py):
    """build_py, then the C# sources copied into ``<build_lib>/optcheck/dotnet_src/``."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        files = csharp_sources()
        if not any(rel.endswith(".csproj") for _, rel in files):
            raise SystemExit("setup.py: dotnet/Worker/*.csproj not found; build the wheel from a full checkout")
        for src, rel in files:
            dest = Path(self.build_lib) / "optcheck" / "dotnet_src" / rel
            self.mkpath(str(dest.parent))
            self.copy_file(str(src), str(dest))


setup(cmdclass={"build_py": BuildPyWithCSharp})
