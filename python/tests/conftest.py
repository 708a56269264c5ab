"""The test server: echo, discard, files and read on the loopback transport inside
this process (rdmactor._testing), reached through contexts on that transport."""

from __future__ import annotations

import pathlib
from typing import Iterator, Tuple

import pytest

import rdmactor
from rdmactor import _testing


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Tuple[str, pathlib.Path]:
    """(address, the files service's store)."""
    store = tmp_path_factory.mktemp("store")
    return _testing.serve_loopback(store), store


@pytest.fixture
def addr(server: Tuple[str, pathlib.Path]) -> str:
    return server[0]


@pytest.fixture
def ctx() -> Iterator[rdmactor.Context]:
    c = _testing.loopback_context()
    yield c
    c.close()


def varint(n: int) -> bytes:
    """postcard's unsigned LEB128 varint, as the echo and discard services speak it."""
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def echo_request(payload: bytes) -> bytes:
    """An echo request (a postcard byte string); its reply has the same encoding."""
    return varint(len(payload)) + payload


def decode_varint(data: bytes) -> int:
    n = shift = 0
    for byte in data:
        n |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return n
        shift += 7
    raise ValueError(f"a truncated varint: {data!r}")
