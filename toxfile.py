"""tox's inline plugin (tox loads ``toxfile.py`` beside ``tox.ini``): makes pyenv's interpreters findable.

tox finds ``python3.10`` ... ``python3.13`` on ``PATH``; pyenv's shims answer for a version only when
``PYENV_VERSION`` names it. So, where pyenv is installed and ``PYENV_VERSION`` is unset, name the newest patch
release of each of 3.10-3.13 that pyenv has: the README's test command then works pasted as written, on any
machine, with whatever patch releases it holds. A ``PYENV_VERSION`` the user set is left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from tox.config.sets import CoreConfigSet
from tox.plugin import impl
from tox.session.state import State

MINORS = (10, 11, 12, 13)


def newest_of_each(versions: list[str]) -> list[str]:
    """The newest ``3.x.y`` of each minor in ``MINORS`` among pyenv's ``versions``, oldest minor first."""
    best: dict[int, tuple[int, str]] = {}
    for name in versions:
        found = re.fullmatch(r"3\.(\d+)\.(\d+)", name.strip())
        if found and int(found[1]) in MINORS:
            minor, patch = int(found[1]), int(found[2])
            if minor not in best or patch > best[minor][0]:
                best[minor] = (patch, name.strip())
    return [best[minor][1] for minor in sorted(best)]


def pyenv_versions() -> list[str]:
    pyenv = shutil.which("pyenv")
    if pyenv is None:
        return []
    listed = subprocess.run([pyenv, "versions", "--bare"], capture_output=True, text=True, timeout=60, check=False)
    return listed.stdout.splitlines() if listed.returncode == 0 else []


@impl
def tox_add_core_config(core_conf: CoreConfigSet, state: State) -> None:
    if os.environ.get("PYENV_VERSION"):
        return
    chosen = newest_of_each(pyenv_versions())
    if chosen:
        os.environ["PYENV_VERSION"] = ":".join(chosen)
