"""Client for rdmactor RDMA servers.

Requests, one-way sends, one-sided reads of ``read`` regions and ``files`` transfers,
built on rdmactor's Rust client through the C library's layer (one implementation of
the protocol). Blocking calls release the GIL while they wait; ``rdmactor.aio`` is the
asyncio form.

Quick start::

    import rdmactor
    with rdmactor.connect("192.0.2.1:7471", "echo") as conn:
        reply = conn.request(b"...")

Every failure raises a subclass of :class:`rdmactor.Error` named by what a caller can
do about it (:class:`Timeout`, :class:`Closed`, :class:`Refused`, ...), with the
framework's reason as its message.
"""

from __future__ import annotations

import os
import threading
from typing import Optional, Sequence, Union

from ._native import (
    Auth,
    BufferTooSmall,
    Busy,
    Closed,
    Connection,
    Context,
    Error,
    FileResult,
    InternalError,
    InvalidArgument,
    IoFailure,
    NotFound,
    ProtocolError,
    Refused,
    ShuttingDown,
    Timeout,
    Unreachable,
)

__all__ = [
    "Auth",
    "BufferTooSmall",
    "Busy",
    "Closed",
    "Connection",
    "Context",
    "Error",
    "FileResult",
    "InternalError",
    "InvalidArgument",
    "IoFailure",
    "NotFound",
    "ProtocolError",
    "Refused",
    "ShuttingDown",
    "Timeout",
    "Unreachable",
    "connect",
    "connect_cluster",
    "default_context",
]

_default: Optional[Context] = None
_default_lock = threading.Lock()


def default_context() -> Context:
    """The process's context on verbs, made on first use (it opens the RDMA device).

    One context is one runtime thread and one set of device resources; most programs
    need only this one. Make a :class:`Context` of your own to close a group of
    connections at once.
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = Context()
        return _default


def connect(
    addr: str,
    service: str,
    key_file: Union[str, os.PathLike[str], None] = None,
    timeout: Optional[float] = 30.0,
    context: Optional[Context] = None,
) -> Connection:
    """Connects to ``service`` at ``addr`` (``"IP:PORT"``).

    ``key_file`` (made by the ``keygen`` tool) proves this client's identity to a
    service that asks for one. ``timeout`` is in seconds, None for no limit. The
    connection is made on ``context``, or on :func:`default_context`.
    """
    ctx = context if context is not None else default_context()
    return ctx.connect(addr, service, key_file, timeout)


def connect_cluster(
    seeds: Union[str, Sequence[str]],
    service: str,
    key_file: Union[str, os.PathLike[str], None] = None,
    timeout: Optional[float] = 30.0,
    context: Optional[Context] = None,
) -> Connection:
    """Connects to ``service`` on a server of a cluster, knowing only ``seeds``.

    ``seeds`` is one or more servers' ``"IP:PORT"`` (a list, or comma-separated).
    They are asked in order which servers serve ``service`` (a server started with
    ``--cluster`` answers from the registry it watches; this client needs no etcd),
    and those are tried least loaded first, each for at most 5 s. Raises
    :class:`Unreachable`, naming every address tried, when none serves.
    """
    ctx = context if context is not None else default_context()
    return ctx.connect_cluster(seeds, service, key_file, timeout)
