#!/bin/sh
# The payload's run.sh (vm/payload.sh puts it there), in the guest as root: the project's tests marked vm, from the
# copy of the checkout's tests/, sim/, fixtures/ at /payload/src, against the wheel installed at /payload/site.
# Arguments of pytest: /payload/pytest-args (shell words) where there is one (default: -m vm tests/vm).
cd /payload/src || exit 2
export PYTHONPATH=/payload/site
ARGS=$(cat /payload/pytest-args 2>/dev/null || echo "-m vm tests/vm")
t0=$(cut -d' ' -f1 /proc/uptime)
echo "guest: python3 -m pytest -q -s $ARGS (apsi_memory $(python3 -c 'import apsi_memory; print(apsi_memory.__version__, apsi_memory.__file__)'))"
# ARGS is shell words (quotes kept: -k 'a or b')
eval "python3 -m pytest -q -s --color=no -p no:cacheprovider --durations=0 --junitxml=$RESULTS/junit.xml $ARGS"
rc=$?
echo "guest: pytest exit $rc after $(awk -v a="$t0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN{printf "%.1f", b - a}') s"
exit $rc
