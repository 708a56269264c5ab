"""For rdmactor's own tests only: not a stable API.

``serve_loopback(files_dir)`` starts echo, files and read on the loopback transport
inside this process and returns its address; ``loopback_context()`` is a context whose
connections use that transport (it reaches those servers and nothing else). The read
service serves ``greeting`` (static) and ``ticker`` (512 little-endian 8-byte words,
all equal to the region's version, rewritten every 2 ms).
``server_connections(addr)`` is how many connections that server has open now.
``set_members(service, [(node, addr), ...])`` sets what every such server's
``members`` service lists for ``service`` (for ``Context.connect_cluster``).
"""

from ._native import loopback_context, serve_loopback, server_connections, set_members

__all__ = ["loopback_context", "serve_loopback", "server_connections", "set_members"]
