"""rdmactor.aio: one thread, one event loop, 100 connections at once."""

from __future__ import annotations

import asyncio
import hashlib
import pathlib
import threading

import pytest

import rdmactor
import rdmactor.aio
from conftest import echo_request
from rdmactor import _testing


def test_one_loop_drives_100_connections_at_once(addr: str) -> None:
    async def main() -> None:
        ctx = rdmactor.aio.Context(_testing.loopback_context())
        conns = await asyncio.gather(*(ctx.connect(addr, "echo") for _ in range(100)))
        assert len({id(c.native) for c in conns}) == 100
        threads = set()

        async def talk(i: int, conn: rdmactor.aio.Connection) -> int:
            ok = 0
            for j in range(20):
                req = echo_request(b"connection %d request %d " % (i, j) + bytes([i]) * j)
                assert await conn.request(req) == req
                threads.add(threading.get_ident())
                ok += 1
            return ok

        # Every connection's requests in flight together, not one connection at a time.
        answered = await asyncio.gather(*(talk(i, c) for i, c in enumerate(conns)))
        assert answered == [20] * 100
        assert threads == {threading.get_ident()}
        await asyncio.gather(*(c.close() for c in conns))
        ctx.close()

    asyncio.run(main())


def test_aio_errors_reads_sends_and_files(addr: str, tmp_path: pathlib.Path) -> None:
    async def main() -> None:
        async with rdmactor.aio.Context(_testing.loopback_context()) as ctx:
            with pytest.raises(rdmactor.Refused):
                await ctx.connect(addr, "no-such")
            echo = await ctx.connect(addr, "echo")
            with pytest.raises(rdmactor.Closed, match="malformed"):
                await echo.request(b"\x7f")
            discard = await ctx.connect(addr, "discard")
            await asyncio.gather(*(discard.send(b"x") for _ in range(10)))
            assert (await discard.request(b"?"))[0] == 10
            reader = await ctx.connect(addr, "read")
            data, _ = await reader.read("greeting")
            assert data.startswith(b"bytes of a region")
            buf = bytearray(64)
            n, _ = await reader.read_into("greeting", buf)
            assert bytes(buf[:n]) == data
            files = await ctx.connect(addr, "files")
            src = tmp_path / "aio-upload.bin"
            payload = hashlib.shake_256(b"aio").digest(3 << 20)
            src.write_bytes(payload)
            r = await files.send_file(src)
            assert r.ok and r.sha256 == hashlib.sha256(payload).hexdigest()
        # Leaving the block closed the context, and with it its connections.
        with pytest.raises(rdmactor.Closed):
            reader.native.read("greeting")

    asyncio.run(main())


def test_aio_connect_cluster_without_blocking_the_loop(addr: str) -> None:
    async def main() -> None:
        _testing.set_members("discard", [("gone", "127.0.0.1:7398"), ("live", addr)])
        async with rdmactor.aio.Context(_testing.loopback_context()) as ctx:
            conns = await asyncio.gather(
                *(ctx.connect_cluster([addr], "discard", timeout=20) for _ in range(10))
            )
            for conn in conns:
                await conn.send(b"x")
                assert (await conn.request(b"?"))[0] == 1
            await asyncio.gather(*(c.close() for c in conns))

    asyncio.run(main())
