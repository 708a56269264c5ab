#!/usr/bin/env bash
# shellcheck disable=SC2034,SC2154 # sets kernel_image, initrd, cache for the sourcing script; uses its repo, script_dir
# Shared by scripts/softroce (one VM) and scripts/wire (two VMs on a virtual wire):
# host packages, the kernel, its modules and the initramfs, cached under <repo>/.softroce.
# Sourced, not run: expects $repo, $script_dir (the scripts/ folder), log and die.
# vm_prepare sets kver, kernel_image, initrd and cache.

# The guest CPU: all TCG emulates but ERMS/FSRM. With them glibc's memset and memcpy
# use `rep stosb`/`rep movsb`, which TCG runs very slowly: a 1 MiB memset took 1.3 ms
# in the VM against 0.008 ms on the host. RDMACTOR_VM_CPU overrides it.
VM_CPU=${RDMACTOR_VM_CPU:-max,-erms,-fsrm}

# Modules to load, in this order; modprobe --show-depends adds what each one
# needs. Built-in or absent modules are skipped. virtio_net and sch_netem serve
# scripts/wire (a NIC per host, tc netem for loss and delay); unused in one VM.
wanted_modules=(virtio_pci netfs fscache 9pnet_virtio 9p configfs crc32_generic
    dummy ib_core ib_uverbs udp_tunnel ip6_udp_tunnel rdma_rxe iw_cm ib_cm
    rdma_cm rdma_ucm virtio_console virtio_net sch_netem)

fetch_kernel() { # -> sets kver, kdir
    local pkg
    if [ -z "${RDMACTOR_VM_REFRESH:-}" ] && [ -f "$cache/kernel/current" ]; then
        kver=$(cat "$cache/kernel/current")
        kdir=$cache/kernel/$kver
        [ -f "$kdir/ready" ] && return 0
    fi
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
        awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }')
    [ -n "$pkg" ] || die "cannot resolve the kernel package behind linux-image-amd64"
    kver=${pkg#linux-image-}
    kver=${kver%-unsigned}
    kdir=$cache/kernel/$kver
    if [ ! -f "$kdir/ready" ]; then
        log "fetching kernel $pkg (first run only)"
        local tmp
        tmp=$(mktemp -d "$cache/kernel/.tmp.XXXXXX")
        (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "$pkg" >/dev/null 2>&1) ||
            { rm -rf "$tmp"; die "apt-get download $pkg failed"; }
        dpkg -x "$tmp"/*.deb "$tmp/root"
        # Trixie's kernel packages ship their modules under usr/lib/modules (merged
        # /usr); bookworm's under lib/modules, where depmod -b and modprobe -d look.
        if [ ! -d "$tmp/root/lib/modules" ] && [ -d "$tmp/root/usr/lib/modules" ]; then
            mkdir -p "$tmp/root/lib"
            mv "$tmp/root/usr/lib/modules" "$tmp/root/lib/modules"
        fi
        local ver
        ver=$(ls "$tmp/root/lib/modules")
        [ "$ver" = "$kver" ] || { rm -rf "$tmp"; die "unexpected module directory $ver in $pkg"; }
        depmod -b "$tmp/root" "$kver"
        rm -rf "$kdir" "$tmp"/*.deb "$tmp/root/usr"
        mv "$tmp/root" "$kdir"
        rmdir "$tmp"
        touch "$kdir/ready"
    fi
    echo "$kver" >"$cache/kernel/current"
}

build_initramfs() { # -> sets initrd
    local key tree order m line path name n=0
    key=$( { cat "$init_src"; echo "${wanted_modules[*]}"; sha256sum </bin/busybox; } |
        sha256sum | cut -c1-16)
    initrd=$cache/initramfs/$kver-$key.cpio.gz
    [ -f "$initrd" ] && return 0
    tree=$(mktemp -d "$cache/initramfs/.tmp.XXXXXX")
    mkdir -p "$tree"/{bin,dev,proc,sys,lib/modules,newroot,repo}
    cp /bin/busybox "$tree/bin/busybox"
    for m in $(/bin/busybox --list); do
        [ "$m" = busybox ] || ln -s busybox "$tree/bin/$m"
    done
    mknod -m 600 "$tree/dev/console" c 5 1
    mknod -m 666 "$tree/dev/null" c 1 3
    install -m 755 "$init_src" "$tree/init"
    order=$tree/lib/modules/order
    : >"$order"
    for m in "${wanted_modules[@]}"; do
        # Lines look like "insmod /path/x.ko [opts]" or "builtin x".
        while read -r line; do
            # shellcheck disable=SC2086 # split the line into words on purpose
            set -- $line
            [ "${1:-}" = insmod ] || continue
            path=$2
            name=$(basename "$path")
            name=${name%.ko*}.ko
            grep -qx "[0-9]*-$name" "$order" && continue
            n=$((n + 1))
            case "$path" in
                *.ko) cp "$path" "$tree/lib/modules/$n-$name" ;;
                *.ko.xz) xz -dc "$path" >"$tree/lib/modules/$n-$name" ;;
                *.ko.zst) zstd -qdc "$path" >"$tree/lib/modules/$n-$name" ;;
                *.ko.gz) gzip -dc "$path" >"$tree/lib/modules/$n-$name" ;;
                *) continue ;;
            esac
            echo "$n-$name" >>"$order"
        done < <(modprobe -d "$kdir" -S "$kver" --show-depends "$m" 2>/dev/null || true)
    done
    grep -q -- '-rdma_rxe.ko$' "$order" || grep -q '^builtin rdma_rxe' \
        <(modprobe -d "$kdir" -S "$kver" --show-depends rdma_rxe 2>/dev/null) ||
        { rm -rf "$tree"; die "kernel $kver has no rdma_rxe"; }
    (cd "$tree" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 | gzip -1) >"$initrd.tmp.$$"
    mv "$initrd.tmp.$$" "$initrd"
    rm -rf "$tree"
}

# Under TCG, decompressing the bzImage costs seconds on every boot. With
# CONFIG_PVH, qemu boots the uncompressed ELF vmlinux directly, so extract it
# once (the payload is the first xz or zstd stream in the bzImage).
extract_vmlinux() { # -> sets kernel_image
    local vmlinuz=$kdir/boot/vmlinuz-$kver off magic unpack
    [ -f "$vmlinuz" ] || die "missing $vmlinuz"
    kernel_image=$vmlinuz
    if [ -f "$kdir/vmlinux" ]; then
        kernel_image=$kdir/vmlinux
        return 0
    fi
    [ -f "$kdir/no-vmlinux" ] && return 0
    grep -q '^CONFIG_PVH=y' "$kdir/boot/config-$kver" 2>/dev/null || { touch "$kdir/no-vmlinux"; return 0; }
    for magic in '\xFD7zXZ\x00:xz -dc --single-stream' '\x28\xB5\x2F\xFD:zstd -qdc'; do
        off=$(LC_ALL=C grep -obUaP "${magic%%:*}" "$vmlinuz" | head -n1 | cut -d: -f1) || true
        [ -n "$off" ] || continue
        unpack=${magic#*:}
        # shellcheck disable=SC2086
        tail -c +$((off + 1)) "$vmlinuz" | $unpack >"$kdir/vmlinux.tmp" 2>/dev/null || true
        if [ "$(head -c 4 "$kdir/vmlinux.tmp" | od -An -c | tr -d ' ')" = '177ELF' ]; then
            mv "$kdir/vmlinux.tmp" "$kdir/vmlinux"
            kernel_image=$kdir/vmlinux
            return 0
        fi
    done
    rm -f "$kdir/vmlinux.tmp"
    touch "$kdir/no-vmlinux"
}

vm_prepare() {
    # --- Host packages. ---------------------------------------------------------
    apt_install softroce qemu-system-x86 busybox-static cpio kmod iproute2 rdma-core \
        ibverbs-providers ibverbs-utils rdmacm-utils perftest xz-utils zstd curl mount

    # --- Kernel, modules and initramfs (cached under <repo>/.softroce). ---------
    cache=$repo/.softroce
    mkdir -p "$cache/kernel" "$cache/initramfs" "$cache/runs"
    init_src=$script_dir/lib/softroce-init.sh
    [ -f "$init_src" ] || die "missing $init_src"

    exec 9>"$cache/lock"
    flock 9
    fetch_kernel
    extract_vmlinux
    build_initramfs
    flock -u 9
    exec 9>&-
}

# vm_write_run_script FILE CWD CMD [ARGS...]: the script a guest runs for one command:
# the caller's PATH, HOME, RUST_LOG, RUST_BACKTRACE, RDMACTOR_* and CARGO_* variables,
# no memlock limit, many files, CWD, then exec CMD.
vm_write_run_script() {
    local file=$1 dir=$2 v
    shift 2
    {
        echo '#!/bin/bash'
        echo '# generated by scripts/lib/vm.sh'
        for v in PATH HOME RUST_LOG RUST_BACKTRACE; do
            [ -n "${!v+x}" ] && printf 'export %s=%q\n' "$v" "${!v}"
        done
        while IFS= read -r v; do
            printf 'export %s=%q\n' "$v" "${!v}"
        done < <(compgen -e | grep -E '^(RDMACTOR_|CARGO_)' || true)
        echo 'ulimit -l unlimited || echo "softroce: cannot raise the memlock limit" >&2'
        echo 'ulimit -n 65536 || true'
        printf 'cd -- %q || exit 125\n' "$dir"
        printf 'exec'
        printf ' %q' "$@"
        printf '\n'
    } >"$file"
}
