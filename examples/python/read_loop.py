#!/usr/bin/env python3
"""read_loop: reads a `read` region again and again with one-sided READs.

    python3 read_loop.py 192.0.2.1:7471 REGION [COUNT] [INTERVAL_S]

The flow of the pyverbs seed, on rdmactor: a passive server exposes a region (and may
update it meanwhile); the client looks it up once (the server grants a window bound to
this connection) and then reads it with RDMA READs only, the server's CPU not involved.
Each read is one consistent version: a read that overlaps an update is retried, never
torn. Reads go into one buffer, reused (`read_into`). Prints a line per read: the
version and the first bytes; exits 1 if a version ever goes backwards.
"""

from __future__ import annotations

import sys
import time
from typing import List, Optional

import rdmactor


def main(argv: List[str], context: Optional[rdmactor.Context] = None) -> int:
    if len(argv) < 3:
        print("usage: read_loop.py ADDR:PORT REGION [COUNT] [INTERVAL_S]", file=sys.stderr)
        return 2
    addr, region = argv[1], argv[2]
    count = int(argv[3]) if len(argv) > 3 else 10
    interval = float(argv[4]) if len(argv) > 4 else 0.1
    with rdmactor.connect(addr, "read", context=context) as conn:
        data, last = conn.read(region)
        buf = bytearray(len(data))
        for i in range(count):
            n, version = conn.read_into(region, buf)
            if version < last:
                print(f"read_loop: version {version} after {last}", file=sys.stderr)
                return 1
            last = version
            print(f"read {i} version={version} len={n} head={bytes(buf[:16]).hex()}")
            if interval > 0:
                time.sleep(interval)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except rdmactor.Error as e:
        print(f"read_loop: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
