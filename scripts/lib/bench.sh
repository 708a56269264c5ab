# shellcheck shell=bash
# Sourced by the benchmark scripts (after common.sh): reading the examples' RESULT lines,
# taking the middle of rounds, and starting a `server` to measure against.

# field NAME < "RESULT k=v ...": the value of NAME on the last RESULT line read.
field() {
    sed -n "s/.* $1=\([^ ]*\).*/\1/p" | tail -1
}

# median3 A B C: the middle of three numbers.
median3() { printf '%s\n' "$@" | sort -g | sed -n 2p; }

# median VALUES...: the middle value (the mean of the two middle ones for an even count).
median() {
    printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# start_server NAME PORT [ARGS...]: `$bin/server --listen $ip:PORT ARGS` in the
# background, waited for until it listens (30 s at most); its log is $tmp/NAME.log. The
# caller sets bin, ip and tmp and defines die.
# shellcheck disable=SC2154 # bin, ip and tmp are the caller's
start_server() {
    local name=$1 port=$2 waited
    shift 2
    "$bin/server" --listen "$ip:$port" "$@" >"$tmp/$name.log" 2>&1 &
    local pid=$!
    for waited in $(seq 1 300); do
        grep -q "^listening on " "$tmp/$name.log" && return 0
        kill -0 "$pid" 2>/dev/null || die "the $name server exited before listening: $(cat "$tmp/$name.log")"
        [ "$waited" -lt 300 ] || break
        sleep 0.1
    done
    die "the $name server is not listening after 30 s: $(cat "$tmp/$name.log")"
}
