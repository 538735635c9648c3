"""Copy a git checkout as CI would see it: the files git tracks, nothing else.

A CI service clones the repository; what a user keeps beside the sources in their own
clone (a ``.venv``, ``venv``, ``.tox``, run folders, editor files) is not in that clone, and
must not leak into what a test treats as the repository (issue 50: a user's ``.venv``
copied into the GitLab pipeline's project collided with the job's own ``.venv``).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def tracked_files(checkout: Path) -> list[str]:
    """The paths (relative, POSIX) that ``git ls-files`` lists as tracked in ``checkout``.

    Untracked files, ignored or not, are left out. Raises ``subprocess.CalledProcessError``
    when ``checkout`` is not a git work tree.
    """
    out = subprocess.run(["git", "ls-files", "-z", "--cached"], cwd=checkout, check=True,
                         capture_output=True).stdout.decode()
    return [rel for rel in out.split("\0") if rel]


def copy_tracked(checkout: Path, dest: Path) -> int:
    """Copy the tracked files of ``checkout`` that exist on disk into ``dest``; return how many.

    A tracked file deleted in the work tree (not yet committed) is skipped, as a clone of the
    work tree's state would not have it; modified tracked files are copied as they are on disk.
    """
    n = 0
    for rel in tracked_files(checkout):
        src = checkout / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
            n += 1
        elif src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).symlink_to(src.readlink())
            n += 1
    return n
