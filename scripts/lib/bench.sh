# shellcheck shell=bash
# Sourced by the benchmark scripts (after common.sh): reading the examples' RESULT lines
# and taking the middle of three rounds.

# field NAME < "RESULT k=v ...": the value of NAME on the last RESULT line read.
field() {
    sed -n "s/.* $1=\([^ ]*\).*/\1/p" | tail -1
}

# median3 A B C: the middle of three numbers.
median3() { printf '%s\n' "$@" | sort -g | sed -n 2p; }
