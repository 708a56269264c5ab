#!/usr/bin/env bash
# shellcheck disable=SC2154 # hostdir, repo, cwd, script_dir, run_id, mtu, ...: set by scripts/wire or vm.env
# Host side of scripts/wire: booting, killing and talking to the VMs (2 to 4) of one
# wire run. Sourced by scripts/wire, which also serves the `scripts/wire ctl ...` requests
# of a driver (a test) through these functions.
#
# A wire run lives in two directories:
#   $w (under <repo>/.softroce/runs, shared with the guests): vm.env, a/, b/, ... (each
#     guest's run directory: run.sh, ready, listening, netdev, console.log), and
#     jobs/<host>/<name>/ (run.sh, out, err, pid, status) for every job;
#   $hostdir (a short path under /tmp, host only): the wire's unix sockets, the FIFOs
#     of each guest's control port and monitor, each qemu's pid.
# Expects log and die (from the sourcing script) and common.sh.

# The hosts of this run: a and b (scripts/wire's default), or --hosts 3 or 4 more
# (c, d). Set by wire_set_hosts from the count, which vm.env keeps for ctl requests.
# shellcheck disable=SC2034 # used by scripts/wire
wire_hosts=(a b)
wire_all_hosts=(a b c d)
wire_set_hosts() { # wire_set_hosts N (2..4)
    [[ ${1:-} =~ ^[234]$ ]] || die "--hosts takes 2, 3 or 4 (got '${1:-}')"
    wire_hosts=("${wire_all_hosts[@]:0:$1}")
}
wire_ip() { # wire_ip HOST
    local i
    for i in "${!wire_hosts[@]}"; do
        if [ "${wire_hosts[$i]}" = "$1" ]; then
            echo "192.0.2.$((i + 1))"
            return 0
        fi
    done
    die "no host named '$1' (hosts: ${wire_hosts[*]})"
}
# Two hosts are joined point to point (a qemu dgram netdev); more share a bridge.
wire_peer() { [ "$1" = a ] && echo b || echo a; }

# Loads vm.env of the run in $RDMACTOR_WIRE (for ctl requests).
wire_load() {
    w=${RDMACTOR_WIRE:-}
    if [ -z "$w" ] || [ ! -f "$w/vm.env" ]; then
        die "RDMACTOR_WIRE does not name a running wire (start one with scripts/wire --driver CMD)"
    fi
    # shellcheck source=/dev/null
    source "$w/vm.env"
    wire_set_hosts "${hosts:-2}"
}

wire_pid() { # wire_pid HOST -> qemu pid of HOST if it runs
    local pid
    [ -f "$hostdir/$1.pid" ] || return 1
    read -r pid <"$hostdir/$1.pid" || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    echo "$pid"
}

# wire_boot HOST: start HOST's qemu (again) and wait until its agent listens. A guest
# kernel that panics while booting is booted again, twice at most (see scripts/softroce:
# trixie's 6.12 kernel under TCG, about one boot in ten).
wire_boot() {
    local attempt
    for attempt in 1 2 3; do
        wire_boot_once "$1" && return 0
        if [ "$attempt" -lt 3 ] && grep -q 'Kernel panic' "$w/$1/console.log" 2>/dev/null; then
            log "host $1: the guest kernel panicked while booting (attempt $attempt); booting again"
            mv "$w/$1/console.log" "$w/$1/console.log.$attempt"
            continue
        fi
        return 1
    done
}

wire_boot_once() {
    local h=$1 ip n append netdev
    ip=$(wire_ip "$h")
    n=${ip##*.}
    if [ "${#wire_hosts[@]}" -gt 2 ]; then
        # The host's own tap port on the run's bridge (scripts/wire made both).
        netdev="tap,id=net0,ifname=wire-$h,script=no,downscript=no"
    else
        netdev="dgram,id=net0,local.type=unix,local.path=$hostdir/$h.sock"
        netdev="$netdev,remote.type=unix,remote.path=$hostdir/$(wire_peer "$h").sock"
    fi
    wire_pid "$h" >/dev/null && die "host $h is already running"
    # A fresh start: no stale requests in the control FIFO, no socket left bound.
    rm -f "$hostdir/$h.sock" "$hostdir/$h.ctl.in" "$hostdir/$h.ctl.out" \
        "$hostdir/$h.mon.in" "$hostdir/$h.mon.out" "$w/$h/ready" "$w/$h/listening"
    mkfifo "$hostdir/$h.ctl.in" "$hostdir/$h.ctl.out" "$hostdir/$h.mon.in" "$hostdir/$h.mon.out"
    mkdir -p "$w/$h"
    printf '%s\n' "$repo" >"$w/$h/repo"
    vm_write_run_script "$w/$h/run.sh" "$cwd" "$script_dir/lib/wire-agent" "$w" "$h"
    append="console=ttyS0 panic=-1 mitigations=off tsc=reliable quiet loglevel=1"
    append="$append softroce_run=$run_id/$h softroce_mtu=$mtu softroce_host=$h softroce_ip=$ip"
    # shellcheck disable=SC2054 # qemu option values are comma-separated
    local qemu=(qemu-system-x86_64
        -accel tcg,thread=multi -cpu "$VM_CPU" -smp "$smp" -m "$mem"
        -nodefaults -display none -no-reboot
        -kernel "$kernel_image" -initrd "$initrd" -append "$append"
        -chardev "file,id=con,path=$w/$h/console.log" -serial chardev:con
        -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
        -virtfs "local,path=$repo,mount_tag=repo,security_model=none,multidevs=remap"
        -netdev "$netdev"
        -device "virtio-net-pci,netdev=net0,mac=52:54:00:0d:0e:0$n"
        -device virtio-serial-pci
        -chardev "pipe,id=ctl,path=$hostdir/$h.ctl" -device virtserialport,chardev=ctl,name=ctl
        -chardev "file,id=out,path=$w/$h/agent.out" -device virtserialport,chardev=out,name=out
        -chardev "file,id=err,path=$w/$h/agent.err" -device virtserialport,chardev=err,name=err
        -chardev "pipe,id=mon,path=$hostdir/$h.mon" -mon chardev=mon,mode=readline)
    # setsid: a driver's Ctrl-C or a test harness's process-group kill must not take
    # the VM down behind the wire's back; scripts/wire's exit stops it.
    setsid "${qemu[@]}" </dev/null >"$w/$h/qemu.log" 2>&1 &
    echo $! >"$hostdir/$h.pid"
    local t0=$SECONDS
    while [ ! -e "$w/$h/listening" ]; do
        if ! wire_pid "$h" >/dev/null; then
            log "host $h: qemu exited while booting"
            cat "$w/$h/qemu.log" >&2 || true
            tail -n 40 "$w/$h/console.log" 2>/dev/null | tr -d '\r' >&2 || true
            return 1
        fi
        if [ $((SECONDS - t0)) -gt 180 ]; then
            log "host $h: no agent after 180 s"
            tail -n 40 "$w/$h/console.log" 2>/dev/null | tr -d '\r' >&2 || true
            return 1
        fi
        sleep 0.1
    done
}

# wire_kill HOST: SIGKILL HOST's qemu, the way a host dies: no FIN, no DISCONNECT.
wire_kill() {
    local pid
    pid=$(wire_pid "$1") || { log "host $1 is not running"; return 0; }
    kill -KILL "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
}

wire_request() { # wire_request HOST LINE: one line into HOST's control port
    local fd
    wire_pid "$1" >/dev/null || die "host $1 is not running"
    # Read-write open: never blocks, even if qemu has not opened its end yet.
    exec {fd}<>"$hostdir/$1.ctl.in"
    printf '%s\n' "$2" >&"$fd"
    exec {fd}>&-
}

wire_monitor() { # wire_monitor HOST COMMAND: one qemu monitor command
    local fd
    wire_pid "$1" >/dev/null || die "host $1 is not running"
    exec {fd}<>"$hostdir/$1.mon.in"
    printf '%s\n' "$2" >&"$fd"
    exec {fd}>&-
    # Drain what the monitor printed so its FIFO never fills up.
    timeout 1 cat "$hostdir/$1.mon.out" >>"$w/$1/monitor.log" 2>/dev/null || true
}

# wire_spawn HOST NAME CMD...: start CMD on HOST as job NAME (cwd: the caller's).
wire_spawn() {
    local h=$1 name=$2 dir
    shift 2
    wire_ip "$h" >/dev/null
    [[ $name =~ ^[A-Za-z0-9._-]+$ ]] || die "job name '$name': letters, digits, . _ - only"
    dir=$w/jobs/$h/$name
    [ -e "$dir" ] && die "host $h already has a job named $name"
    mkdir -p "$dir"
    local here
    here=$(pwd -P)
    case "$here/" in "$repo"/*) ;; *) here=$cwd ;; esac
    vm_write_run_script "$dir/run.sh" "$here" "$@"
    wire_request "$h" "run $name"
}

# wire_wait HOST NAME [SECS]: wait for job NAME, print its output prefixed with the
# host, return its status (124 on timeout, 255 if the host died first).
wire_wait() {
    local h=$1 name=$2 limit=${3:-900} dir rc t0=$SECONDS
    dir=$w/jobs/$h/$name
    [ -d "$dir" ] || die "host $h has no job named $name"
    while [ ! -f "$dir/status" ]; do
        if ! wire_pid "$h" >/dev/null; then
            rc=255
            break
        fi
        if [ $((SECONDS - t0)) -ge "$limit" ]; then
            rc=124
            break
        fi
        sleep 0.1
    done
    sed "s/^/$h| /" "$dir/out" 2>/dev/null || true
    sed "s/^/$h| /" "$dir/err" >&2 2>/dev/null || true
    case "${rc:-}" in
        255) log "host $h died before job $name ended"; return 255 ;;
        124) log "job $name on host $h still running after $limit s"; return 124 ;;
    esac
    read -r rc <"$dir/status"
    return "$rc"
}
