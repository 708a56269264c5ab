"""The asyncio form of rdmactor's client: the same calls, awaited.

Connects, requests, sends, reads and file transfers are the C library's non-blocking
operations: each is submitted at once and its completion lands in the context's
queue, whose eventfd is registered with the event loop (``loop.add_reader``). One
thread running one loop drives any number of connections, with no thread per
connection or per call. Only ``close`` waits in the loop's default executor.

::

    import asyncio, rdmactor.aio

    async def main():
        conn = await rdmactor.aio.connect("192.0.2.1:7471", "echo")
        reply = await conn.request(b"...")
        await conn.close()

A context is bound to the first running loop that uses it.
"""

from __future__ import annotations

import asyncio
import functools
import os
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

from . import _native
from ._native import FileResult, ShuttingDown

__all__ = ["Connection", "Context", "connect", "default_context"]

PathLike = Union[str, "os.PathLike[str]"]


class Context:
    """A native :class:`rdmactor.Context` driven from an event loop."""

    def __init__(self, native: Optional[_native.Context] = None) -> None:
        self.native = native if native is not None else _native.Context()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._fd: Optional[int] = None
        self._pending: Dict[int, "asyncio.Future[Any]"] = {}

    def _attach(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._fd = self.native.fileno()
            loop.add_reader(self._fd, self._drain)
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("this rdmactor.aio.Context is bound to another event loop")
        return loop

    def _drain(self) -> None:
        # The fd stays readable while completions remain, so a batch cap only splits
        # a burst over several wake-ups.
        for op, ok, value in self.native.poll_completions(256):
            fut = self._pending.pop(op, None)
            if fut is None or fut.cancelled():
                # Nobody waits (the caller was cancelled): a connection made anyway
                # is closed rather than leaked.
                if ok and isinstance(value, _native.Connection):
                    value.close()
                continue
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

    def _submit(self, start: Callable[[], int]) -> "asyncio.Future[Any]":
        loop = self._attach()
        fut = loop.create_future()
        # Completions are taken only by _drain, on this loop's thread, so the future is
        # registered before its completion can be looked for.
        self._pending[start()] = fut
        return fut

    async def connect(
        self,
        addr: str,
        service: str,
        key_file: Optional[PathLike] = None,
        timeout: Optional[float] = 30.0,
    ) -> "Connection":
        """Connects to ``service`` at ``addr`` (``"IP:PORT"``); see rdmactor.connect."""
        native = await self._submit(
            lambda: self.native.submit_connect(addr, service, key_file, timeout)
        )
        return Connection(native, self)

    async def connect_cluster(
        self,
        seeds: Union[str, Sequence[str]],
        service: str,
        key_file: Optional[PathLike] = None,
        timeout: Optional[float] = 30.0,
    ) -> "Connection":
        """Connects to ``service`` on a server the ``seeds`` list (see
        rdmactor.Context.connect_cluster), without blocking the loop."""
        native = await self._submit(
            lambda: self.native.submit_connect_cluster(seeds, service, key_file, timeout)
        )
        return Connection(native, self)

    def close(self) -> None:
        """Closes every connection of the context; waiting calls raise ShuttingDown."""
        if self._loop is not None and self._fd is not None:
            self._loop.remove_reader(self._fd)
        self._loop = None
        self.native.close()
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(ShuttingDown("the context was closed"))

    async def __aenter__(self) -> "Context":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class Connection:
    """One connection, its calls awaited. Made by :meth:`Context.connect`."""

    def __init__(self, native: _native.Connection, context: Context) -> None:
        self.native = native
        self.context = context

    async def request(self, data: Any, timeout: Optional[float] = 30.0) -> bytes:
        """Sends ``data`` (any bytes-like object) and returns the reply."""
        result: bytes = await self.context._submit(
            lambda: self.native.submit_request(data, timeout)
        )
        return result

    async def send(self, data: Any, timeout: Optional[float] = 30.0) -> None:
        """Sends ``data`` one way; returns once the connection has queued it."""
        await self.context._submit(lambda: self.native.submit_send(data, timeout))

    async def _blocking(self, call: Callable[..., Any], *args: Any) -> Any:
        loop = self.context._attach()
        return await loop.run_in_executor(None, functools.partial(call, *args))

    async def read(
        self, region: str, offset: int = 0, timeout: Optional[float] = 30.0
    ) -> Tuple[bytes, int]:
        """One consistent version of ``region`` from ``offset``, and that version."""
        result: Tuple[bytes, int] = await self.context._submit(
            lambda: self.native.submit_read(region, offset, None, timeout)
        )
        return result

    async def read_into(
        self, region: str, buf: Any, offset: int = 0, timeout: Optional[float] = 30.0
    ) -> Tuple[int, int]:
        """``read`` into a writable buffer: ``(length, version)``; ``BufferTooSmall``
        with the length needed (``args[1]``) when the region does not fit."""
        view = memoryview(buf).cast("B")
        if view.readonly:
            raise TypeError("read_into needs a writable buffer")
        data, version = await self.context._submit(
            lambda: self.native.submit_read(region, offset, view.nbytes, timeout)
        )
        view[: len(data)] = data
        return len(data), version

    async def send_file(
        self,
        path: PathLike,
        name: Optional[str] = None,
        overwrite: bool = False,
        timeout: Optional[float] = None,
    ) -> FileResult:
        """Uploads ``path`` to ``files``; the verdict is in the result."""
        result: FileResult = await self.context._submit(
            lambda: self.native.submit_send_file(path, name, overwrite, timeout)
        )
        return result

    async def fetch_file(
        self,
        name: str,
        dir: PathLike,
        overwrite: bool = False,
        timeout: Optional[float] = None,
    ) -> FileResult:
        """Fetches ``name`` from ``files`` into ``dir``."""
        result: FileResult = await self.context._submit(
            lambda: self.native.submit_fetch_file(name, dir, overwrite, timeout)
        )
        return result

    async def close(self) -> None:
        """Closes and releases the connection (waits in the executor). Idempotent."""
        await self._blocking(self.native.close)

    async def __aenter__(self) -> "Connection":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


_default: Optional[Context] = None


def default_context() -> Context:
    """The asyncio form of :func:`rdmactor.default_context` (the same native one)."""
    global _default
    if _default is None:
        from . import default_context as native_default

        _default = Context(native_default())
    return _default


async def connect(
    addr: str,
    service: str,
    key_file: Optional[PathLike] = None,
    timeout: Optional[float] = 30.0,
    context: Optional[Context] = None,
) -> Connection:
    """Connects to ``service`` at ``addr`` on ``context`` or the default one."""
    ctx = context if context is not None else default_context()
    return await ctx.connect(addr, service, key_file, timeout)
