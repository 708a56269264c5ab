#!/bin/sh
# /init of the softroce VM (runs under busybox sh as PID 1; see scripts/softroce).
#
# It loads the modules listed in /lib/modules/order, mounts the host's root
# filesystem (9p tag "hostroot", read-only) on /newroot and the repository
# (9p tag "repo", writable) over its own path inside it, brings up Soft-RoCE
# (rxe0 on the VM's NIC if qemu gave it one, else on the dummy interface rxenet0;
# address from softroce_ip=, default 192.0.2.1/24, plus that address + 100 as a
# second local address, so that a test can connect as a second peer host; MTU from
# softroce_mtu=),
# then runs the per-run script <repo>/.softroce/runs/<id>/run.sh chrooted into
# /newroot. The command's stdout/stderr go to the virtio ports "out"/"err",
# which the host connects to its own stdout/stderr. The exit status is written
# to the run directory as "status", and the VM powers off.
#
# It prints nothing unless something fails: its own chatter goes to /init.log,
# which is copied to the console (a log file on the host) on failure.

export PATH=/bin
exec </dev/null >/init.log 2>&1

fail() {
    {
        echo "softroce-init: $*"
        echo "--- init log:"
        cat /init.log
    } >/dev/console 2>&1
    sync
    poweroff -f
    sleep 30
}

mount -t devtmpfs devtmpfs /dev || fail "cannot mount devtmpfs"
mount -t proc proc /proc || fail "cannot mount /proc"
mount -t sysfs sysfs /sys || fail "cannot mount /sys"
grep -qw quiet /proc/cmdline && echo 1 >/proc/sys/kernel/printk

while read -r mod; do
    [ -n "$mod" ] || continue
    # "File exists": already present (built in or pulled in): not an error.
    msg=$(insmod "/lib/modules/$mod" 2>&1) || case "$msg" in
        *"File exists"*) echo "$msg" ;;
        *) fail "insmod $mod failed: $msg" ;;
    esac
done </lib/modules/order

run_id="" mtu=1500 host=softroce ip=192.0.2.1
read -r cmdline </proc/cmdline
for arg in $cmdline; do
    case "$arg" in
        softroce_run=*) run_id=${arg#softroce_run=} ;;
        softroce_mtu=*) mtu=${arg#softroce_mtu=} ;;
        softroce_host=*) host=${arg#softroce_host=} ;;
        softroce_ip=*) ip=${arg#softroce_ip=} ;;
    esac
done
[ -n "$run_id" ] || fail "no softroce_run= on the kernel command line"

# 9p: large messages; the read-only root may be cached, the repository is
# shared live with the host (cache=mmap still allows shared mmap).
p9="trans=virtio,version=9p2000.L,msize=512000"
mkdir -p /newroot /repo
mount -t 9p -o "$p9,ro,cache=loose" hostroot /newroot || fail "cannot mount 9p hostroot"
mount -t 9p -o "$p9,cache=mmap" repo /repo || fail "cannot mount 9p repo"

run=/repo/.softroce/runs/$run_id
[ -f "$run/run.sh" ] || fail "run directory $run is missing"
read -r repo_path <"$run/repo" || fail "cannot read $run/repo"

R=/newroot
mount -t proc proc $R/proc || fail "chroot /proc"
mount -t sysfs sysfs $R/sys || fail "chroot /sys"
if [ -d $R/sys/kernel/config ]; then
    mount -t configfs configfs $R/sys/kernel/config || true
fi
mount -t devtmpfs devtmpfs $R/dev || fail "chroot /dev"
mkdir -p $R/dev/shm $R/dev/pts
mount -t tmpfs -o mode=1777 tmpfs $R/dev/shm || fail "chroot /dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666 devpts $R/dev/pts || true
mount -t tmpfs -o mode=1777 tmpfs $R/tmp || fail "chroot /tmp"
mount -t tmpfs -o mode=0755 tmpfs $R/run || true
# A repository under /tmp or /run is hidden by the tmpfs: recreate its path.
[ -d "$R$repo_path" ] || mkdir -p "$R$repo_path"
mount -o bind /repo "$R$repo_path" || fail "cannot bind the repository to $repo_path"
# Directories shared with `scripts/softroce --share DIR`, each at its own path.
if [ -s "$run/shares" ]; then
    i=0
    while IFS= read -r path; do
        [ -n "$path" ] || continue
        mkdir -p "/share$i"
        mount -t 9p -o "$p9,cache=mmap" "share$i" "/share$i" || fail "cannot mount 9p share$i ($path)"
        [ -d "$R$path" ] || mkdir -p "$R$path" || fail "cannot create $path in the guest"
        mount -o bind "/share$i" "$R$path" || fail "cannot bind $path"
        i=$((i + 1))
    done <"$run/shares"
fi

# Networking. One VM (scripts/softroce): nothing leaves it (qemu gives it no NIC)
# and rxe runs over a dummy interface. Two VMs (scripts/wire): rxe runs over the
# virtio NIC qemu joined to the other host's; this is the only network either has.
# iproute2 (ip, rdma, tc) comes from the host via the chroot.
hostname "$host"
ip link set lo up || fail "cannot bring lo up"
in_root() { chroot $R /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
netdev=""
for n in /sys/class/net/*; do
    # Only a device-backed interface (the virtio NIC) has "device"; lo and the
    # dummy module's own dummy0 do not.
    if [ -e "$n/device" ]; then
        netdev=${n##*/}
        break
    fi
done
if [ -z "$netdev" ]; then
    netdev=rxenet0
    in_root ip link add rxenet0 type dummy || fail "cannot create rxenet0"
fi
in_root ip link set "$netdev" mtu "$mtu" || fail "cannot set the MTU of $netdev to $mtu"
in_root ip link set "$netdev" up || fail "cannot bring $netdev up"
in_root ip addr add "$ip/24" dev "$netdev" || fail "cannot address $netdev"
second=${ip%.*}.$((${ip##*.} + 100))
in_root ip addr add "$second/24" dev "$netdev" || fail "cannot add $second to $netdev"
in_root rdma link add rxe0 type rxe netdev "$netdev" || fail "cannot create rxe0"
echo "$netdev" >"$run/netdev"

# Generous socket limits for many connections (TCP side channels, rdma_cm).
sysctl_set() { [ -w "/proc/sys/$1" ] && echo "$2" >"/proc/sys/$1"; }
sysctl_set net/core/somaxconn 4096
sysctl_set net/core/netdev_max_backlog 10000
sysctl_set net/core/rmem_max 16777216
sysctl_set net/core/wmem_max 16777216
sysctl_set net/core/rmem_default 1048576
sysctl_set net/core/wmem_default 1048576
sysctl_set net/core/optmem_max 1048576
sysctl_set net/ipv4/tcp_max_syn_backlog 4096
sysctl_set net/ipv4/ip_local_port_range "10000 65000"

# The command's output channels (virtio-serial ports named by the host).
out="" err=""
for p in /sys/class/virtio-ports/*; do
    [ -f "$p/name" ] || continue
    case "$(cat "$p/name")" in
        out) out=/dev/${p##*/} ;;
        err) err=/dev/${p##*/} ;;
    esac
done
if [ ! -c "$out" ] || [ ! -c "$err" ]; then
    fail "virtio ports out/err not found"
fi

: >"$run/ready"
chroot $R /usr/bin/env -i /bin/bash --noprofile --norc "$repo_path/.softroce/runs/$run_id/run.sh" \
    </dev/null >"$out" 2>"$err"
rc=$?
echo "$rc" >"$run/status.tmp" && mv "$run/status.tmp" "$run/status"
sync
if [ -s "$run/shares" ]; then
    while IFS= read -r path; do
        [ -n "$path" ] && umount "$R$path" 2>/dev/null
    done <"$run/shares"
fi
umount "$R$repo_path" 2>/dev/null
umount /repo 2>/dev/null
poweroff -f
sleep 30
