#!/usr/bin/env python3
"""files: uploads a file to a server's `files` service and checks the verdict.

    python3 files.py 192.0.2.1:7471 FILE [KEY_FILE]

Prints `GOOD FILE sha256:HEX BYTES` when the server stored the file and its SHA-256
is the one hashlib computes here (the line examples/c/ft.c prints), or the verdict and
the server's reason; exits 0 only for GOOD with the same digest.
"""

from __future__ import annotations

import hashlib
import sys
from typing import List, Optional

import rdmactor


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def main(argv: List[str], context: Optional[rdmactor.Context] = None) -> int:
    if len(argv) < 3:
        print("usage: files.py ADDR:PORT FILE [KEY_FILE]", file=sys.stderr)
        return 2
    addr, path = argv[1], argv[2]
    key = argv[3] if len(argv) > 3 else None
    with rdmactor.connect(addr, "files", key_file=key, context=context) as conn:
        r = conn.send_file(path)
    if not r.ok:
        print(f"{r.verdict} {path}: {r.reason}")
        return 1
    local = sha256_of(path)
    if r.sha256 != local:
        print(f"files: the server's digest {r.sha256} is not this file's {local}", file=sys.stderr)
        return 1
    print(f"GOOD {path} sha256:{r.sha256} {r.bytes}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except rdmactor.Error as e:
        print(f"files: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
