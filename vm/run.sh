#!/bin/bash
# run.sh PAYLOAD_DIR [RESULTS_DIR]: boot the bed's VM (the image make-image.sh made), run PAYLOAD_DIR/run.sh in it
# as root, bring back what it left in /results, power off. Exit status: the payload's run.sh's; 124 when the VM ran
# past APSI_VM_TIMEOUT; 3 when it ended without saying (a kernel panic, a crash of the init).
#
# In the guest: PID 1 is vm/guest/init2.sh (pure cgroup v2 at /sys/fs/cgroup, +memory for the root's children, no
# systemd). Disks: vda the image's root.ext4, opened snapshot=on (the image never changes, every boot starts clean);
# vdb the results disk; vdc the payload disk, a tar archive of PAYLOAD_DIR (with init2.sh), unpacked to /payload
# by stage 1. Results out: the guest's /results ($RESULTS), written as a tar archive onto vdb and unpacked into
# RESULTS_DIR (default: a temporary folder, removed), with the serial console as console.log; the console is also
# printed as it comes. The exit status is /results/rc (the console's last "=== VM-EXIT rc=N" where it is missing).
#
# Knobs: APSI_VM_IMAGE (the image's folder; default: what make-image.sh prints, building it where absent),
#        APSI_VM_TIMEOUT (s, default 1500: tests/vm ran past 900 s at host load 14), APSI_VM_MEM (MiB, default 2048), APSI_VM_CPUS (default 2),
#        APSI_VM_ACCEL (tcg | kvm | auto, default auto: kvm only where a probe boot of this kernel under it
#        reached the payload, remembered per image beside it in the cache; /dev/kvm of a PVM host boots no stock
#        kernel), APSI_VM_APPEND (more kernel arguments), APSI_VM_QEMU (the qemu binary).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PAYLOAD=${1:?usage: run.sh PAYLOAD_DIR [RESULTS_DIR]}
RESULTS=${2:-}
[ -f "$PAYLOAD/run.sh" ] || { echo "run.sh: no run.sh in $PAYLOAD" >&2; exit 2; }
IMAGE=${APSI_VM_IMAGE:-$("$HERE/make-image.sh" | tail -1)}
for f in vmlinux initrd-base.cpio.gz root.ext4; do
    [ -f "$IMAGE/$f" ] || { echo "run.sh: no $f in $IMAGE (make it with vm/make-image.sh)" >&2; exit 2; }
done
QEMU=${APSI_VM_QEMU:-qemu-system-x86_64}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/apsi-vm-run.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# boot PAYLOAD ACCEL SECONDS LOG RESULTS_IMG: one boot; its status is timeout's (124) or qemu's
boot() {
    local payload=$1 accel=$2 seconds=$3 log=$4 disk=$5 work cpu=max accel_opts
    work=$(mktemp -d "$TMP/boot.XXXXXX")
    mkdir -p "$work/payload"
    cp -a "$payload/." "$work/payload/"
    install -m 755 "$HERE/guest/init2.sh" "$work/payload/init2.sh"
    tar -cf "$work/payload.tar" -C "$work" payload   # the payload disk: a tar archive, whole 512-byte blocks
    rm -rf "$work/payload"
    truncate -s 256M "$disk"
    accel_opts=tcg,thread=multi,tb-size=256
    if [ "$accel" = kvm ]; then accel_opts=kvm; cpu=host,-arch-capabilities; fi
    timeout --foreground -k 10 "$seconds" \
      "$QEMU" -M pc -accel "$accel_opts" -cpu "$cpu" -smp "${APSI_VM_CPUS:-2}" -m "${APSI_VM_MEM:-2048}" \
        -nodefaults -no-user-config -display none -serial stdio -monitor none -no-reboot \
        -drive "file=$IMAGE/root.ext4,format=raw,if=virtio,snapshot=on,cache=unsafe" \
        -drive "file=$disk,format=raw,if=virtio,cache=unsafe" \
        -drive "file=$work/payload.tar,format=raw,if=virtio,readonly=on" \
        -kernel "$IMAGE/vmlinux" -initrd "$IMAGE/initrd-base.cpio.gz" \
        -append "console=ttyS0 quiet panic=-1 cgroup_no_v1=all mitigations=off random.trust_cpu=on ${APSI_VM_APPEND:-}" \
        < /dev/null 2>&1 | tee "$log"
    return "${PIPESTATUS[0]}"
}

accel() {  # the accelerator to boot with (see APSI_VM_ACCEL)
    local want=${APSI_VM_ACCEL:-auto} probe verdict
    if [ "$want" != auto ]; then echo "$want"; return; fi
    [ -r /dev/kvm ] && [ -w /dev/kvm ] || { echo tcg; return; }
    probe="$(dirname "$IMAGE")/.kvm-probe-$(basename "$IMAGE")-$(uname -r)"
    if [ ! -f "$probe" ]; then
        mkdir -p "$TMP/probe" && printf 'echo probe: payload reached\n' > "$TMP/probe/run.sh"
        verdict=tcg
        if boot "$TMP/probe" kvm 20 "$TMP/probe.log" "$TMP/probe.img" >/dev/null 2>&1 \
           && grep -q "^probe: payload reached" "$TMP/probe.log"; then verdict=kvm; fi
        echo "$verdict" > "$probe" 2>/dev/null || true
        echo "run.sh: KVM probe: $verdict ($(grep -c . "$TMP/probe.log" 2>/dev/null || echo 0) console lines)" >&2
        echo "$verdict"; return
    fi
    cat "$probe"
}

ACCEL=$(accel)
LOG=$TMP/console.log
T0=$(date +%s.%N)
set +e
boot "$PAYLOAD" "$ACCEL" "${APSI_VM_TIMEOUT:-1500}" "$LOG" "$TMP/results.img"
qrc=$?
set -e
WALL=$(awk -v n="$(date +%s.%N)" -v p="$T0" 'BEGIN{printf "%.1f", n - p}')
mkdir -p "$TMP/results"   # this boot's only: an rc left in RESULTS_DIR by an earlier run is never read
tar -xf "$TMP/results.img" -C "$TMP/results" 2>/dev/null || true
cp "$LOG" "$TMP/results/console.log"
rc=$(cat "$TMP/results/rc" 2>/dev/null || sed -n 's/^=== VM-EXIT rc=\([0-9]*\).*/\1/p' "$LOG" | tail -1)
if [ -n "$RESULTS" ]; then mkdir -p "$RESULTS" && cp -a "$TMP/results/." "$RESULTS/"; fi
if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
    echo "=== host: the VM ran past ${APSI_VM_TIMEOUT:-1500} s ($ACCEL), killed; $WALL s wall"
    exit 124
fi
echo "=== host: $ACCEL, qemu exit $qrc, payload rc ${rc:-none}, $WALL s wall${RESULTS:+, results in $RESULTS}"
case "$rc" in
'' | *[!0-9]*) exit 3 ;;
*) exit "$rc" ;;
esac
