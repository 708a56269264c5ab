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
    printf '%s: line %s%s: `%s` failed (exit %s)\n' "${where##*/}" "$line" "$func" "$cmd" "$rc" >&2
    exit "$rc"
}
trap 'on_error $? $LINENO "$BASH_COMMAND"' ERR
