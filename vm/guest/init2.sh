#!/bin/sh
# Stage 2, PID 1 in the Debian root (no systemd), shipped by run.sh with every boot: pure cgroup v2 at
# /sys/fs/cgroup (the kernel runs with cgroup_no_v1=all), the memory controller enabled for the root's children,
# then /payload/run.sh with /results ($RESULTS) for what it wants back. Its exit status goes to /results/rc and to the console
# ("=== VM-EXIT rc=N"), /results is written as a tar archive onto the results disk (/dev/vdb), then power off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 RESULTS=/results
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /dev/shm /dev/pts && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && mount -t devpts devpts /dev/pts
mount -o remount,rw /
mount -t cgroup2 -o nsdelegate none /sys/fs/cgroup
echo "+memory +cpu +io +pids" > /sys/fs/cgroup/cgroup.subtree_control
hostname apsi-vm
rm -rf /results /tmp/* && mkdir -p /results
echo "stage2: kernel $(uname -r), $(nproc) cpus, MemTotal $(awk '/MemTotal/{print int($2/1024) " MiB"}' /proc/meminfo);" \
     "cgroup2 controllers: $(cat /sys/fs/cgroup/cgroup.controllers); subtree: $(cat /sys/fs/cgroup/cgroup.subtree_control);" \
     "script at uptime $(cut -d' ' -f1 /proc/uptime) s"
cd /payload
sh /payload/run.sh
rc=$?
echo "$rc" > /results/rc
echo "=== VM-EXIT rc=$rc uptime=$(cut -d' ' -f1 /proc/uptime)"
if [ -b /dev/vdb ]; then
    tar -cf /dev/vdb -C /results . || echo "stage2: could not write the results to /dev/vdb"
fi
sync
echo o > /proc/sysrq-trigger
while :; do sleep 1 || :; done   # PID 1 must not exit while the power-off runs (the kernel would panic)
