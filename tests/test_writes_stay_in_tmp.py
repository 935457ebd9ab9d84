"""Issue 26: no test writes outside its temp folders. ``tests/test_bad_env.py`` sets the folder variables to ''
(the default: ``~/.apsi``) and so wrote into the user's real home; run it here under a fresh, empty ``HOME`` and
check that nothing appears there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent


def test_the_bad_environment_tests_leave_the_users_home_alone(tmp_path: Path) -> None:
    home = tmp_path / "user"
    home.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith(("APSI_", "XDG_", "PYTEST_"))}
    env["HOME"] = str(home)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x",
                          str(TESTS / "test_bad_env.py")], cwd=TESTS.parent, env=env, capture_output=True,
                         text=True, timeout=240, check=False)
    made = sorted(str(path.relative_to(home)) for path in home.rglob("*"))
    print(f"\nwritten under the user's HOME: {made}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert made == [], f"written into the user's home: {made}"
