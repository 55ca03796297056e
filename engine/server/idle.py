"""Idle keep-alive connections, oldest first, so the fd limit never locks new clients out.

At the fd limit accept() fails and new clients are reset until idle keep-alive connections
time out (issue 22). The server keeps headroom instead: when the open connections reach
``fd soft limit - reserve``, each new connection closes the oldest idle one; and one client
address never holds more than ``max_per_client`` idle connections (its oldest idle one is
closed first). A client whose idle connection is closed reconnects, as HTTP/1.1 allows.
"""

from __future__ import annotations

import resource
from collections import OrderedDict
from typing import Any

MAX_IDLE_PER_CLIENT = 256


def fd_headroom_threshold() -> int:
    """Open connections at which the oldest idle ones start being closed."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        soft = 1 << 20
    return max(8, soft - max(32, soft // 8))


class IdlePool:
    def __init__(self, max_per_client: int = MAX_IDLE_PER_CLIENT, threshold: int | None = None) -> None:
        self.max_per_client = max_per_client
        self.threshold = fd_headroom_threshold() if threshold is None else threshold
        self._all: OrderedDict[Any, str] = OrderedDict()
        self._by_client: dict[str, OrderedDict[Any, None]] = {}
        self.closed_for_room = 0
        self.closed_per_client = 0

    def __len__(self) -> int:
        return len(self._all)

    def add(self, conn: Any, client: str) -> None:
        """``conn`` (it has ``.transport``) now waits for its next request."""
        self._all[conn] = client
        mine = self._by_client.get(client)     # (setdefault would build a dict per response)
        if mine is None:
            mine = self._by_client[client] = OrderedDict()
        mine[conn] = None
        while len(mine) > self.max_per_client:
            oldest = next(iter(mine))
            self.closed_per_client += 1
            self._close(oldest)

    def discard(self, conn: Any) -> None:
        client = self._all.pop(conn, None)
        if client is None:
            return
        mine = self._by_client.get(client)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self._by_client[client]

    def make_room(self, open_connections: int) -> None:
        """A connection arrived: close the oldest idle ones while at or over the threshold."""
        while open_connections >= self.threshold and self._all:
            oldest = next(iter(self._all))
            self.closed_for_room += 1
            self._close(oldest)
            open_connections -= 1

    def _close(self, conn: Any) -> None:
        self.discard(conn)
        transport = conn.transport
        if not transport.is_closing():
            transport.close()
