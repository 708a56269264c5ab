"""The blocking API end to end against the loopback test server: real bytes, real
digests, and the exception class each failure must raise."""

from __future__ import annotations

import gc
import hashlib
import pathlib
import struct
import threading
import time
from typing import Callable, Tuple

import pytest

import rdmactor
from conftest import decode_varint, echo_request

GREETING = b"bytes of a region, read with one-sided READs"


def test_echo_round_trips_bytes_bytearray_and_memoryview(ctx: rdmactor.Context, addr: str) -> None:
    with ctx.connect(addr, "echo", timeout=5) as conn:
        for payload in [b"hello from Python", bytes(range(256)) * 40, b""]:
            req = echo_request(payload)
            assert conn.request(req) == req
            assert conn.request(bytearray(req)) == req
            assert conn.request(memoryview(b"xx" + req)[2:]) == req


def test_one_way_sends_arrive_before_a_later_request(ctx: rdmactor.Context, addr: str) -> None:
    conn = ctx.connect(addr, "discard")
    for i in range(50):
        conn.send(b"one way %d" % i)
    # discard answers a request with how many one-way messages it has received.
    assert decode_varint(conn.request(b"?")) == 50
    conn.close()


def test_too_large_a_request_is_refused_and_the_connection_goes_on(
    ctx: rdmactor.Context, addr: str
) -> None:
    conn = ctx.connect(addr, "echo")
    # Past the connection's 16 MiB: the caller's mistake, refused before it is sent.
    with pytest.raises(rdmactor.InvalidArgument, match="largest message of 16777216") as e:
        conn.request(echo_request(bytes(16 << 20)))
    assert isinstance(e.value, rdmactor.Error)
    req = echo_request(b"still here")
    assert conn.request(req) == req


def test_a_malformed_request_closes_with_the_servers_reason_and_stays_closed(
    ctx: rdmactor.Context, addr: str
) -> None:
    conn = ctx.connect(addr, "echo")
    with pytest.raises(rdmactor.Closed, match="malformed echo request"):
        conn.request(b"\x7f")
    with pytest.raises(rdmactor.Closed):
        conn.request(echo_request(b"again"))


def test_a_closed_connection_used_again_raises_closed(ctx: rdmactor.Context, addr: str) -> None:
    conn = ctx.connect(addr, "echo")
    conn.close()
    conn.close()  # idempotent
    with pytest.raises(rdmactor.Closed):
        conn.request(echo_request(b"after close"))
    with pytest.raises(rdmactor.Closed):
        conn.send(b"after close")
    # A newer connection does not answer for the old object.
    with ctx.connect(addr, "echo") as again:
        assert again.request(echo_request(b"new")) == echo_request(b"new")
    with pytest.raises(rdmactor.Closed):
        conn.request(echo_request(b"after close"))


def test_closing_the_context_closes_its_connections(addr: str) -> None:
    from rdmactor import _testing

    ctx = _testing.loopback_context()
    conn = ctx.connect(addr, "echo")
    ctx.close()
    with pytest.raises(rdmactor.Closed):
        conn.request(echo_request(b"x"))
    with pytest.raises(rdmactor.Closed):
        ctx.connect(addr, "echo")


def wait_until(what: str, done: Callable[[], bool], within: float = 30.0) -> None:
    """Until `done()` holds; fails naming `what` after `within` seconds (a liveness bound:
    on a busy machine it may take a while, never this long)."""
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_connections_and_contexts_dropped_without_close_are_closed(tmp_path: pathlib.Path) -> None:
    from rdmactor import _testing

    # A server of its own: its count is this test's connections alone.
    addr = _testing.serve_loopback(tmp_path)
    ctx = _testing.loopback_context()
    conns = [ctx.connect(addr, "echo") for _ in range(50)]
    for conn in conns:
        assert conn.request(echo_request(b"x")) == echo_request(b"x")
    assert _testing.server_connections(addr) == 50
    del conns, conn
    gc.collect()
    wait_until("the dropped connections to close", lambda: _testing.server_connections(addr) == 0)
    # The context still serves.
    with ctx.connect(addr, "echo") as again:
        assert again.request(echo_request(b"y")) == echo_request(b"y")

    # A context dropped while its connections are open: freeing it closes them.
    other = _testing.loopback_context()
    held = [other.connect(addr, "echo") for _ in range(10)]
    assert _testing.server_connections(addr) == 10
    del other, held
    gc.collect()
    wait_until("a dropped context's connections to close", lambda: _testing.server_connections(addr) == 0)
    ctx.close()


def test_connect_failures_have_their_classes(ctx: rdmactor.Context, addr: str) -> None:
    with pytest.raises(rdmactor.Refused, match="no-such"):
        ctx.connect(addr, "no-such")
    with pytest.raises(rdmactor.InvalidArgument, match="IP:PORT"):
        ctx.connect("nowhere", "echo")
    with pytest.raises(ValueError):
        ctx.connect(addr, "echo", timeout=0)
    with pytest.raises(rdmactor.Auth):
        ctx.connect(addr, "echo", key_file="/nonexistent/key")


def test_an_upload_of_64_mib_is_good_with_hashlibs_digest_and_comes_back(
    ctx: rdmactor.Context, server: Tuple[str, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    addr, store = server
    # Not a repeating pattern: a chunk sent to the wrong offset changes the digest.
    data = hashlib.shake_256(b"rdmactor python upload").digest(64 << 20)
    src = tmp_path / "py-upload.bin"
    src.write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    conn = ctx.connect(addr, "files")
    r = conn.send_file(src, timeout=120)
    assert (r.verdict, r.ok, r.reason) == ("GOOD", True, "")
    assert r.bytes == len(data)
    assert r.sha256 == want
    assert hashlib.sha256((store / "py-upload.bin").read_bytes()).hexdigest() == want
    # The same name again, without overwrite: the service's verdict, not an exception.
    again = conn.send_file(src)
    assert again.verdict == "REJECTED" and not again.ok and again.reason
    # With overwrite, under another name than the path's.
    named = conn.send_file(str(src), name="renamed.bin", overwrite=True)
    assert named.ok and named.sha256 == want
    # And back.
    dst = tmp_path / "back"
    dst.mkdir()
    got = conn.fetch_file("py-upload.bin", dst, timeout=120)
    assert got.ok and got.sha256 == want and got.bytes == len(data)
    assert hashlib.sha256((dst / "py-upload.bin").read_bytes()).hexdigest() == want
    conn.close()


def test_a_region_reads_whole_from_an_offset_and_into_a_buffer(
    ctx: rdmactor.Context, addr: str
) -> None:
    conn = ctx.connect(addr, "read")
    data, version = conn.read("greeting")
    assert data == GREETING
    assert conn.read("greeting", offset=6)[0] == GREETING[6:]
    buf = bytearray(100)
    n, _ = conn.read_into("greeting", buf)
    assert bytes(buf[:n]) == GREETING and n == len(GREETING)
    assert buf[n:] == bytes(100 - n), "nothing past the region is written"
    small = bytearray(8)
    with pytest.raises(rdmactor.BufferTooSmall) as e:
        conn.read_into("greeting", small)
    assert e.value.args[1] == len(GREETING)
    assert small == bytearray(8)
    with pytest.raises(TypeError):
        conn.read_into("greeting", b"read-only bytes" * 10)
    with pytest.raises(rdmactor.NotFound):
        conn.read("nothing")
    conn.close()


def test_an_updated_region_is_read_one_version_at_a_time(ctx: rdmactor.Context, addr: str) -> None:
    conn = ctx.connect(addr, "read")
    versions = []
    for _ in range(50):
        data, version = conn.read("ticker")
        words = set(struct.unpack("<512Q", data))
        assert words == {version}, "a torn read mixes two versions"
        versions.append(version)
    assert versions == sorted(versions)
    assert versions[-1] > versions[0], "the server updates the region meanwhile"
    conn.close()


def test_threads_share_a_connection_and_each_gets_its_own_reply(
    ctx: rdmactor.Context, addr: str
) -> None:
    conn = ctx.connect(addr, "echo")
    failures = []

    def worker(t: int) -> None:
        for i in range(200):
            req = echo_request(b"thread %d request %d" % (t, i))
            if conn.request(req) != req:
                failures.append((t, i))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    conn.close()


def test_connect_cluster_asks_a_seed_and_skips_a_listed_server_that_is_gone(
    ctx: rdmactor.Context, addr: str
) -> None:
    from rdmactor import _testing

    # Nothing listens at `gone`: it stands for a listed server whose host died.
    gone = "127.0.0.1:7399"
    _testing.set_members("echo", [("gone", gone), ("live", addr)])
    # The first seed is gone too; the second answers with the list.
    with ctx.connect_cluster([gone, addr], "echo", timeout=20) as conn:
        req = echo_request(b"through the cluster")
        assert conn.request(req) == req
    # One seed, as a string.
    with ctx.connect_cluster(f"{addr}", "echo", timeout=20) as conn:
        assert conn.request(echo_request(b"x")) == echo_request(b"x")
    # No live server listed: Unreachable, naming each address and its reason.
    _testing.set_members("echo", [("gone", gone)])
    with pytest.raises(rdmactor.Unreachable, match="node gone at 127.0.0.1:7399"):
        ctx.connect_cluster(addr, "echo", timeout=20)
    # A service the seeds do not know, and no seed at all.
    with pytest.raises(rdmactor.Unreachable, match="no service"):
        ctx.connect_cluster(addr, "nothing-here", timeout=20)
    with pytest.raises(rdmactor.InvalidArgument, match="seeds"):
        ctx.connect_cluster("", "echo")
