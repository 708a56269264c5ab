# shellcheck shell=bash
# Sourced first by every script in scripts/: strict mode, and no silent exits.
#
# Under `set -e` a failing command ends a script with no word of what failed, which is
# how `scripts/demo` once exited 1 on a fresh machine with nothing on the screen. The
# ERR trap below names the script, the line, the function and the command, and exits
# with the command's status. `set -E` makes functions, command substitutions and
# subshells inherit the trap.
set -Eeuo pipefail

on_error() {
    local rc=$1 line=$2 cmd=$3 where=${BASH_SOURCE[1]:-$0}
    local func=${FUNCNAME[1]:-main}
    [ "$func" = main ] && func= || func=" in $func()"
    printf "%s: line %s%s: '%s' failed (exit %s)\n" "${where##*/}" "$line" "$func" "$cmd" "$rc" >&2
    exit "$rc"
}
# A section that inspects exit statuses itself turns both off, then on again: the ERR
# trap fires on any failing command, `set +e` or not.
strict_off() { set +e; trap - ERR; }
strict_on() { set -e; trap 'on_error $? $LINENO "$BASH_COMMAND"' ERR; }
strict_on

# apt_install WHO PKG...: installs the packages dpkg does not list as installed, as root
# (or through sudo), quietly; on failure it prints apt's own output and the ERR trap
# names the step. WHO prefixes the progress line.
apt_install() {
    local who=$1 p status missing=()
    shift
    for p in "$@"; do
        # dpkg-query exits 1 for a package it has never seen: that means "missing" too.
        status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null) || status=
        [ "$status" = installed ] || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    local sudo=()
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || {
            echo "$who: missing packages ${missing[*]}: run as root (or install sudo) to install them" >&2
            return 1
        }
        sudo=(sudo)
    fi
    echo "$who: installing ${missing[*]}" >&2
    # Lock::Timeout waits for another apt/dpkg run instead of failing at once.
    local apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -y -q
        -o DPkg::Lock::Timeout=1800 -o APT::Sandbox::User=root)
    apt_quietly "$who" "${apt[@]}" update || return 1
    apt_quietly "$who" "${apt[@]}" install --no-install-recommends "${missing[@]}" || return 1
}

# apt_quietly WHO CMD...: runs an apt command with its output kept aside, and shows the
# end of that output only when it fails.
apt_quietly() {
    local who=$1 log
    shift
    log=$(mktemp)
    if ! "$@" >"$log" 2>&1; then
        echo "$who: '${*}' failed:" >&2
        tail -n 20 "$log" >&2
        rm -f "$log"
        return 1
    fi
    rm -f "$log"
}

# build_tools [CARGO ARGS...]: the one build of the tools, the C library and the Python
# module that scripts/test, scripts/bench and python-tests share. One command (the same
# packages and targets) so that Cargo resolves the same features each time and finds
# everything built already; a second spelling would compile the shared crates again.
build_tools() {
    cargo build "$@" -p rdmactor-examples -p rdmactor-c -p rdmactor-py --lib --bins --examples
}
