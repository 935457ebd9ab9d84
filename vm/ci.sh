#!/bin/bash
# ci.sh [PYTEST_ARGS...]: the CI step (tox -e vm): the checkout's tests marked vm, in a real cgroup v2 kernel.
#   1. make-image.sh --check: where the bed cannot run (not x86_64 Linux; no image cached and no root or apt to
#      build one) it prints "vm: SKIPPED: <why>" and exits 0;
#   2. make-image.sh: the image, from the cache or built (~1.5 min here, from nothing);
#   3. payload.sh: the wheel + tests/, sim/, fixtures/ of this checkout;
#   4. run.sh: boot, python3 -m pytest -q -s -m vm tests/vm in the guest; results (junit.xml, console.log) in
#      ${APSI_VM_RESULTS:-$TMPDIR/apsi-vm-results}. Exit status: pytest's in the guest (124: the VM timed out).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
T0=$(date +%s)
if ! reason=$("$HERE/make-image.sh" --check); then
    echo "vm: SKIPPED: $reason"
    exit 0
fi
IMAGE=$("$HERE/make-image.sh" | tail -1)
T1=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/apsi-vm-ci.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
"$HERE/payload.sh" "$REPO" "$WORK/payload" "$@"
# The guest runs on the host's CPUs under TCG: at load 15 on 2 cores it got a seventh of them and a 55-s test took
# over 6 minutes. The tests' timeouts (tests/vm/v2_run.py) and the VM's are stretched by the host's load per core
# now (at least 1, at most 10), so a busy host makes the run slower, not red.
SLOWDOWN=${APSI_VM_SLOWDOWN:-$(awk -v n="$(nproc)" '{s = $1 / n; s = s < 1 ? 1 : (s > 10 ? 10 : s); printf "%.1f", s}' /proc/loadavg)}
echo "$SLOWDOWN" > "$WORK/payload/slowdown"
export APSI_VM_TIMEOUT=${APSI_VM_TIMEOUT:-$(awk -v s="$SLOWDOWN" 'BEGIN{printf "%d", 1500 * s}')}
T2=$(date +%s)
RESULTS=${APSI_VM_RESULTS:-${TMPDIR:-/tmp}/apsi-vm-results}
rm -rf "$RESULTS"
set +e
APSI_VM_IMAGE=$IMAGE "$HERE/run.sh" "$WORK/payload" "$RESULTS"
rc=$?
set -e
T3=$(date +%s)
echo "vm: image $((T1 - T0)) s ($IMAGE), payload $((T2 - T1)) s, VM $((T3 - T2)) s, total $((T3 - T0)) s (timeouts x$SLOWDOWN for the host's load); exit $rc"
exit $rc
