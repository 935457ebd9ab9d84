#!/bin/bash
# make-image.sh: the VM image of the cgroup v2 test bed, built from nothing with Debian's packages and PyPI only,
# or found already built in the cache.
#
#   vm/make-image.sh            # prints the image's folder (last line of stdout); builds it first where absent
#   vm/make-image.sh --key      # prints the cache key only (builds nothing, installs nothing)
#   vm/make-image.sh --check    # prints why the bed cannot run here and exits 1; exits 0 silently where it can
#
# The image lives in ${APSI_VM_CACHE:-/var/cache/apsi-vm}/<key>, where key = sha256 of its inputs: this script,
# vm/guest/init, vm/packages.txt, vm/wheels.txt, the Debian suite and the kernel package and version apt would
# install now (APSI_VM_KERNEL="package version" names one instead, without asking apt). It is built in a temporary
# folder beside it and renamed into place when complete (a build killed halfway leaves no image), under a lock (two
# builds of one key at once: the second waits, then finds the first's image). Its files:
#   vmlinux              Debian 12's cloud kernel, uncompressed (qemu boots its PVH entry: no bootloader)
#   initrd-base.cpio.gz  busybox-static + the virtio block modules + vm/guest/init (stage 1)
#   root.ext4            bookworm: the essential set + vm/packages.txt + the wheels of vm/wheels.txt in /usr/local,
#                        byte-compiled; 4 GiB sparse; run.sh opens it snapshot=on, so it never changes
#   kernel-version, packages.txt (what dpkg installed), timings.txt (seconds per stage), key-inputs.txt
# Building needs root (apt-get installs qemu-system-x86, mmdebstrap, busybox-static on the host; mmdebstrap
# --mode=root; chroot) and reaches only the Debian archive and PyPI.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${APSI_VM_CACHE:-/var/cache/apsi-vm}
SUITE=bookworm
IMG_SIZE=4G
INPUTS=(make-image.sh guest/init packages.txt wheels.txt)   # relative to vm/: what the image is made of
HOST_PACKAGES=(qemu-system-x86 mmdebstrap busybox-static cpio lz4 e2fsprogs)
export DEBIAN_FRONTEND=noninteractive

# Another apt (a second CI job, unattended-upgrades) may hold dpkg's lock: wait for it, as long as an install of
# the host packages takes at load 15, instead of failing at once ('Could not get lock /var/lib/dpkg/lock-frontend').
apt_get() { apt-get -o DPkg::Lock::Timeout=600 "$@"; }

kernel_package() {  # "linux-image-<abi>-cloud-amd64 <version>": what apt would install now; empty if it cannot say
    if [ -n "${APSI_VM_KERNEL:-}" ]; then echo "$APSI_VM_KERNEL"; return; fi
    command -v apt-cache >/dev/null || return 0
    local pkg
    pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
    [ -n "$pkg" ] || return 0
    echo "$pkg $(apt-cache show --no-all-versions "$pkg" 2>/dev/null | awk '/^Version:/{print $2; exit}')"
}

key_inputs() {  # the text the key hashes: each input file (name and bytes), the suite, the kernel
    local f
    for f in "${INPUTS[@]}"; do
        printf '== %s %s\n' "$f" "$(sha256sum < "$HERE/$f" | cut -d' ' -f1)"
    done
    echo "suite $SUITE"
    echo "kernel $1"
}

image_key() { key_inputs "$1" | sha256sum | cut -d' ' -f1; }

image_complete() { [ -f "$1/vmlinux" ] && [ -f "$1/initrd-base.cpio.gz" ] && [ -f "$1/root.ext4" ]; }

can_run() {  # prints the reason where the bed cannot run here; status 0 where it can
    local os arch kernel
    os=$(uname -s); arch=$(uname -m)
    if [ "$os" != Linux ] || [ "$arch" != x86_64 ]; then
        echo "the VM bed needs an x86_64 Linux host (qemu boots Debian's amd64 cloud kernel); this is $os $arch"
        return 1
    fi
    kernel=$(kernel_package)
    if [ -n "$kernel" ] && image_complete "$CACHE/$(image_key "$kernel")" && command -v qemu-system-x86_64 >/dev/null; then
        return 0  # built and bootable: no root or network needed
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "building the VM image needs root (apt-get, mmdebstrap --mode=root, chroot), and none is cached in $CACHE"
        return 1
    fi
    if ! command -v apt-get >/dev/null || ! command -v apt-cache >/dev/null; then
        echo "building the VM image needs Debian's apt (qemu-system-x86, mmdebstrap, linux-image-cloud-amd64); no apt-get here"
        return 1
    fi
    return 0
}

case "${1:-}" in
--key)
    kernel=$(kernel_package)
    [ -n "$kernel" ] || { echo "apt does not know linux-image-cloud-amd64 (run apt-get update, or set APSI_VM_KERNEL)" >&2; exit 2; }
    image_key "$kernel"; exit 0 ;;
--check)
    can_run; exit ;;
"") ;;
*)
    echo "usage: make-image.sh [--key|--check]" >&2; exit 2 ;;
esac

reason=$(can_run) || { echo "make-image: $reason" >&2; exit 3; }
kernel=$(kernel_package)
if [ -n "$kernel" ] && image_complete "$CACHE/$(image_key "$kernel")"; then
    echo "make-image: cached, $CACHE/$(image_key "$kernel")" >&2
    if ! command -v qemu-system-x86_64 >/dev/null; then  # root here (can_run): the image is cached, qemu is not
        qemu=(install -y -q --no-install-recommends qemu-system-x86)
        apt_get "${qemu[@]}" >/dev/null 2>&1 || { apt_get update -q >/dev/null && apt_get "${qemu[@]}" >/dev/null; } \
            || { echo "make-image: apt could not install qemu-system-x86 for the cached image" >&2; exit 5; }
    fi
    echo "$CACHE/$(image_key "$kernel")"
    exit 0
fi

# -- build --------------------------------------------------------------------------------------------------------
T0=$(date +%s.%N)
TL=$T0
TIMINGS=$(mktemp)
stage() {  # stage NAME: print and record the seconds since the previous stage
    local now; now=$(date +%s.%N)
    awk -v n="$now" -v p="$TL" -v s="$1" 'BEGIN{printf "%-32s %6.1f s\n", s, n - p}' | tee -a "$TIMINGS" >&2
    TL=$now
}

apt_get update -q >/dev/null
apt_get install -y -q --no-install-recommends "${HOST_PACKAGES[@]}" >/dev/null
python3 -m pip --version >/dev/null 2>&1 || apt_get install -y -q --no-install-recommends python3-pip >/dev/null
stage "host packages + apt lists"
kernel=$(kernel_package)   # again, after apt-get update: the kernel apt installs now
[ -n "$kernel" ] || { echo "make-image: apt does not know linux-image-cloud-amd64" >&2; exit 4; }
KEY=$(image_key "$kernel")
OUT=$CACHE/$KEY
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock-$KEY"
flock 9
if image_complete "$OUT"; then  # another build of this key finished while we waited
    echo "make-image: built meanwhile, $OUT" >&2; echo "$OUT"; exit 0
fi
W=$(mktemp -d "$CACHE/.build-$KEY.XXXXXX")
chmod 755 "$W"   # apt-get download writes in it as _apt
cleanup() {
    # a failed mmdebstrap may leave /dev, /proc or /sys mounted in the root: unmount before removing anything
    awk -v r="$W/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do umount -l "$m" || true; done
    rm -rf "$W" "$TIMINGS"
}
trap cleanup EXIT
key_inputs "$kernel" > "$W/key-inputs.txt"
echo "make-image: building $OUT (kernel $kernel)" >&2

# kernel: the .deb only, unpacked (nothing installed on the host) -------------------------------------------------
read -r KPKG KVERSION <<< "$kernel"
KVER=${KPKG#linux-image-}
mkdir -p "$W/kernel" && chmod 777 "$W/kernel"   # apt-get download runs as _apt: it must write here
(cd "$W/kernel" && apt-get download -q "$KPKG=$KVERSION" >/dev/null)
dpkg-deb -x "$W/kernel/${KPKG}_"*.deb "$W/kernel/root"
# The uncompressed ELF (the bzImage carries it lz4-compressed): qemu boots it through its PVH note.
python3 - "$W/kernel/root/boot/vmlinuz-$KVER" "$W/vmlinux" <<'PY'
import subprocess, sys
data = open(sys.argv[1], "rb").read()
i = data.find(b"\x02\x21\x4c\x18")  # lz4 legacy frame
while i >= 0:
    out = subprocess.run(["lz4", "-dc"], input=data[i:], capture_output=True).stdout
    if out[:4] == b"\x7fELF":
        open(sys.argv[2], "wb").write(out)
        sys.exit(0)
    i = data.find(b"\x02\x21\x4c\x18", i + 1)
sys.exit("no lz4-compressed ELF in the bzImage")
PY
echo "$KVER $KVERSION" > "$W/kernel-version"
stage "kernel ($KVER $KVERSION)"

# stage-1 initramfs: busybox, the virtio modules, guest/init ------------------------------------------------------
IR=$W/initrd
mkdir -p "$IR/bin" "$IR/lib/modules"
cp /bin/busybox "$IR/bin/busybox"
M=$W/kernel/root/lib/modules/$KVER/kernel
for m in drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_pci_legacy_dev \
         drivers/virtio/virtio_pci_modern_dev drivers/virtio/virtio_pci drivers/block/virtio_blk; do
    cp "$M/$m.ko" "$IR/lib/modules/"
done
install -m 755 "$HERE/guest/init" "$IR/init"
(cd "$IR" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) > "$W/initrd-base.cpio.gz"
rm -rf "$IR" "$W/kernel"
stage "initramfs"

# PyPI wheels, pinned, each named (no dependency resolution) ------------------------------------------------------
mapfile -t WHEELS < <(grep -v '^\s*\(#\|$\)' "$HERE/wheels.txt")
mkdir -p "$W/wheels"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform manylinux2014_x86_64 -d "$W/wheels" "${WHEELS[@]}" 2>&1 | grep -v "^WARNING: Location" >&2 || true
[ "$(ls "$W/wheels" | wc -l)" = "${#WHEELS[@]}" ] || { echo "make-image: wheels missing: $(ls "$W/wheels")" >&2; exit 5; }
stage "wheels (PyPI, ${#WHEELS[@]})"

# Debian root -----------------------------------------------------------------------------------------------------
MIRROR=$(awk '/^URIs:/{print $2; exit} /^deb /{print $2; exit}' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true)
INCLUDE=$(grep -v '^\s*\(#\|$\)' "$HERE/packages.txt" | paste -sd, -)
R=$W/rootfs
mmdebstrap --mode=root --variant=essential -q --include="$INCLUDE" \
    --dpkgopt='force-unsafe-io' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    --customize-hook='echo apsi-vm > "$1/etc/hostname"; mkdir -p "$1/payload"' \
    "$SUITE" "$R" ${MIRROR:+"$MIRROR"} >&2
stage "root (mmdebstrap)"
SITE=$R/usr/local/lib/python3.11/dist-packages
python3 -m pip install -q --no-deps --no-index --no-compile --target "$SITE" --python-version 3.11 \
    --implementation cp --platform manylinux2014_x86_64 --only-binary=:all: "$W"/wheels/*.whl 2>&1 \
    | grep -v "^WARNING: Location" >&2 || true
rm -rf "$SITE/bin" "$W/wheels"
# (without /proc mounted psutil prints a traceback it recovers from: shown only where the import fails)
chroot "$R" python3 -c 'import blake3, pytest, pytest_timeout, numpy, psutil, xxhash' > "$W/import.log" 2>&1 \
    || { cat "$W/import.log" >&2; echo "make-image: the guest's python3 cannot import its packages" >&2; exit 6; }
rm -f "$W/import.log"
chroot "$R" python3 -m compileall -q -j 0 /usr/local/lib/python3.11/dist-packages >/dev/null
chroot "$R" dpkg-query -W -f '${Package} ${Version}\n' > "$W/packages.txt"
ls "$SITE" | sed -n 's/^\(.*\)-\([^-]*\)\.dist-info$/\1 \2 (PyPI)/p' >> "$W/packages.txt"
stage "wheels installed, byte-compiled"

mke2fs -q -t ext4 -L apsi-root -d "$R" "$W/root.ext4" "$IMG_SIZE" > "$W/mke2fs.log" 2>&1 \
    || { cat "$W/mke2fs.log" >&2; exit 7; }
rm -f "$W/mke2fs.log"
rm -rf "$R"
stage "image (mke2fs -d)"
awk -v n="$(date +%s.%N)" -v p="$T0" 'BEGIN{printf "%-32s %6.1f s\n", "TOTAL", n - p}' | tee -a "$TIMINGS" >&2
cp "$TIMINGS" "$W/timings.txt"
chmod 644 "$W/timings.txt"
rm -rf "$OUT"        # an incomplete folder of this key (not one of ours: ours appear complete)
mv -T "$W" "$OUT"   # atomic: the image appears complete or not at all
trap 'rm -f "$TIMINGS"' EXIT
echo "make-image: $OUT: $(du -sh --apparent-size "$OUT/root.ext4" | cut -f1) apparent, $(du -sh "$OUT" | cut -f1) used, $(wc -l < "$OUT/packages.txt") packages" >&2
echo "$OUT"
