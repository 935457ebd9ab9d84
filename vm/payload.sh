#!/bin/bash
# payload.sh CHECKOUT OUT [PYTEST_ARGS...]: the payload run.sh boots with, from an apsi_memory checkout:
#   OUT/site/      the project's wheel (pip wheel --no-deps CHECKOUT), installed here with --no-deps and
#                  byte-compiled by this host's Python where it is the guest's (3.11): the guest imports it from here
#   OUT/src/       CHECKOUT's tests/, sim/, fixtures/ and pyproject.toml (pytest's settings and markers)
#   OUT/run.sh     vm/guest/run-tests.sh: python3 -m pytest -q -s -m vm tests/vm (or PYTEST_ARGS)
# PYTHON names the host's interpreter (default python3).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "${1:?usage: payload.sh CHECKOUT OUT [PYTEST_ARGS...]}" && pwd)
OUT=${2:?usage: payload.sh CHECKOUT OUT [PYTEST_ARGS...]}
shift 2
PY=${PYTHON:-python3}
rm -rf "$OUT" && mkdir -p "$OUT/wheel" "$OUT/src"
"$PY" -m pip wheel -q --no-deps -w "$OUT/wheel" "$SRC" 2>&1 | grep -v "^WARNING: Location" >&2 || true
ls "$OUT"/wheel/*.whl >/dev/null
COMPILE=--no-compile
[ "$("$PY" -c 'import sys; print(sys.version_info[:2] == (3, 11))')" = True ] && COMPILE=--compile
"$PY" -m pip install -q --no-deps --no-index $COMPILE --target "$OUT/site" "$OUT"/wheel/*.whl 2>&1 \
    | grep -v "^WARNING: \(Location\|Running pip\)" >&2 || true
[ -d "$OUT/site/apsi_memory" ] || { echo "payload.sh: the wheel did not install into $OUT/site" >&2; exit 1; }
rm -rf "$OUT/site/bin" "$OUT/wheel"
for d in tests sim fixtures pyproject.toml; do cp -a "$SRC/$d" "$OUT/src/"; done
find "$OUT/src" -name __pycache__ -prune -exec rm -rf {} +
install -m 755 "$HERE/guest/run-tests.sh" "$OUT/run.sh"
if [ "$#" -gt 0 ]; then echo "$*" > "$OUT/pytest-args"; fi
echo "payload: $(ls "$OUT/site" | grep -c dist-info) wheel, $(du -sh "$OUT" | cut -f1)" >&2
