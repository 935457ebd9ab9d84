"""benchmarks/plots.py draws readable, small PNGs, and the README shows the committed ones with their command."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MAX_BYTES = 200 * 1024


def test_the_committed_pictures_are_small_pngs_shown_in_the_readme_with_their_command() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    pictures = sorted(p.name for p in (REPO / "docs").glob("*.png"))
    assert pictures == ["oom.png", "pool.png", "rss_stream.png", "store_set.png"]
    for name in pictures:
        data = (REPO / "docs" / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) < MAX_BYTES, name
        assert f"](docs/{name})" in readme, f"README does not show docs/{name}"
    assert re.search(r"python benchmarks/plots\.py", readme)


def test_plots_draws_the_store_and_pool_pictures_at_small_sizes(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is the optional 'plot' extra: pip install '.[plot]'")
    pytest.importorskip("diskcache", reason="diskcache is in the optional 'bench' extra: pip install '.[bench]'")
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "plots.py"), "--only", "store", "pool",
                             "--entries", "1000", "--pool-shape", "64", "1024", "--out", str(tmp_path),
                             "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    for name in ("store_set.png", "pool.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and 5_000 < len(data) < MAX_BYTES
