#!/usr/bin/env python3
"""echo: calls a server's `echo` service from Python.

    python3 echo.py 192.0.2.1:7471 "hello"          one request, its reply printed
    python3 echo.py 192.0.2.1:7471 "" 10000 64      10000 round trips of 64 bytes, timed
    python3 echo.py --seeds 192.0.2.1:7471,192.0.2.2:7471 "hello"
                            any server of a cluster (`server --cluster`) the seeds list

`echo` takes a postcard-encoded struct { payload: bytes }: the payload's length as a
LEB128 varint, then the payload; its reply has the same encoding. The timed form
prints the line examples/c/echo_client.c prints, with kind=py-echo.
"""

from __future__ import annotations

import sys
import time
from typing import List, Optional

import rdmactor


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def main(argv: List[str], context: Optional[rdmactor.Context] = None) -> int:
    seeds = len(argv) > 1 and argv[1] == "--seeds"
    if seeds:
        argv = argv[1:]
    addr = argv[1] if len(argv) > 1 else "192.0.2.1:7471"
    text = (argv[2] if len(argv) > 2 else "hello from Python").encode()
    rounds = int(argv[3]) if len(argv) > 3 else 1
    size = int(argv[4]) if len(argv) > 4 else len(text)
    payload = text[:size].ljust(size, b"\0")
    req = varint(size) + payload
    us = []
    if seeds:
        conn = rdmactor.connect_cluster(addr, "echo", timeout=20, context=context)
    else:
        conn = rdmactor.connect(addr, "echo", timeout=5, context=context)
    with conn:
        for _ in range(rounds):
            t0 = time.perf_counter()
            reply = conn.request(req, timeout=5)
            us.append((time.perf_counter() - t0) * 1e6)
            if reply != req:
                print("echo: the reply differs from the request", file=sys.stderr)
                return 1
    if rounds == 1:
        print("echo:", reply[len(req) - size :].decode(errors="replace"))
    elif rounds > 1:
        us.sort()
        print(
            f"RESULT kind=py-echo size={size} rounds={rounds} "
            f"p50_us={us[rounds // 2]:.1f} p99_us={us[rounds * 99 // 100]:.1f}"
        )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except rdmactor.Error as e:
        print(f"echo: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
