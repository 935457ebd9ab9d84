"""benchmarks/plots.py draws readable, small PNGs; the docs show the committed ones with their command, and quote
for each the numbers it drew (written beside it as JSON)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MAX_BYTES = 200 * 1024


FIGURES = REPO / "docs" / "figures.md"


def test_the_committed_pictures_are_small_pngs_shown_in_the_docs_with_their_command() -> None:
    page = FIGURES.read_text(encoding="utf-8")
    pictures = sorted(p.name for p in (REPO / "docs").glob("*.png"))
    assert pictures == ["oom.png", "pool.png", "rss_stream.png", "store_set.png"]
    for name in pictures:
        data = (REPO / "docs" / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) < MAX_BYTES, name
        assert f"]({name})" in page, f"docs/figures.md does not show docs/{name}"
    assert re.search(r"python benchmarks/plots\.py", page)


def prose() -> str:
    """docs/figures.md with its line breaks as spaces (a figure may be wrapped anywhere)."""
    return " ".join(FIGURES.read_text(encoding="utf-8").split())


def drawn(name: str) -> dict[str, object]:
    return dict(json.loads((REPO / "docs" / name).read_text(encoding="utf-8")))


def test_the_docs_quote_the_numbers_the_store_picture_drew() -> None:
    """Before, docs/store_set.png showed 1.9x diskcache's speed against the 3.5-4.1x the text claimed."""
    numbers = drawn("store_set.json")
    page = prose()
    ratio = numbers["summary"]["times_faster_than_diskcache"]  # type: ignore[index]
    assert f"**{ratio:.1f}× diskcache's speed**" in page
    for name, micros in numbers["median_micros"].items():  # type: ignore[attr-defined]
        assert f"{name}` at {micros:.0f} µs" in page or f"{name} at {micros:.0f} µs" in page, name
    assert f"over {numbers['rounds']} rounds" in page


def test_the_docs_quote_the_numbers_the_pool_picture_drew() -> None:
    """Before, docs/pool.png showed the pool 1.7x slower than fresh memory while the text said 1.27-1.36x faster."""
    numbers = drawn("pool.json")
    page = prose()
    faster = numbers["summary"]["times_faster_than_fresh"]  # type: ignore[index]
    for way in ("take(zero=True)", "take(zero=False)"):
        assert f"`{way}` **{faster[way]:.2f}× fresh's speed**" in page, way
    table = next(line for line in FIGURES.read_text(encoding="utf-8").splitlines() if line.startswith("| pool, twenty"))
    assert f"(**{faster['take(zero=True)']:.2f}×** fresh's speed)" in table
    assert f"(**{faster['take(zero=False)']:.2f}×**)" in table
    assert f"medians of {numbers['rounds']} rounds" in table


def test_plots_draws_the_store_and_pool_pictures_at_small_sizes(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is the optional 'plot' extra: pip install '.[plot]'")
    pytest.importorskip("diskcache", reason="diskcache is in the optional 'bench' extra: pip install '.[bench]'")
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "plots.py"), "--only", "store", "pool",
                             "--entries", "1000", "--pool-shape", "64", "1024", "--rounds", "2", "--out", str(tmp_path),
                             "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    for name in ("store_set.png", "pool.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and 5_000 < len(data) < MAX_BYTES
    assert json.loads((tmp_path / "store_set.json").read_text())["entries"][-1] == 1000
    pool = json.loads((tmp_path / "pool.json").read_text())
    assert pool["summary"]["times_faster_than_fresh"]["fresh"] == 1.0 and pool["command"].endswith("--pool-shape 64 1024")
