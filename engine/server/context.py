"""Per-request records shared by the app (app.py), the generation flows (handlers.py) and the
small routes (routes.py): a leaf, so that none of those imports another to name them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from zgtool.engine.outputs import RequestOutput
from zgtool.engine.server.admission import Principal
from zgtool.engine.server.tracing import parse_traceparent

# Server-Timing of every answer: these parts in this order, formatted in one step from a tuple of
# their values (handlers build the tuple; no dict per request)
SERVER_TIMING_KEYS = ("queue", "prefill", "decode", "detok", "safety", "total")
SERVER_TIMING_FMT = b", ".join(b"%s;dur=%%.3f" % k.encode() for k in SERVER_TIMING_KEYS)

Handler = Callable[..., Awaitable[None]]     # a route: (app, ctx, scope, receive, send)


@dataclass(frozen=True)
class Routes:
    """What the app serves (routes.table() builds it): the handler per method of each path."""

    exact: dict[str, dict[str, Handler]]                       # path -> {method: handler}
    prefix: tuple[tuple[str, dict[str, Handler]], ...] = ()    # (path prefix, {method: handler}), first match

# What the keepalive ticker pushes into a silent stream (never a real output: compared by identity)
KEEPALIVE = RequestOutput(request_id="", token_ids=[], text="")


class Ctx:
    """Per-request state shared by the handlers."""

    __slots__ = ("rid", "api", "t0", "headers", "principal", "started", "safety_ms", "status", "log", "error_type",
                 "cycle", "trace")

    def __init__(self, rid: str, api: str, t0: float, headers: dict[bytes, bytes], cycle: Any = None) -> None:
        self.rid = rid
        self.api = api
        self.t0 = t0
        self.headers = headers
        self.principal: Principal | None = None
        self.started = False          # response headers sent
        self.safety_ms = 0.0          # input-side safety time (the engine times the output side)
        self.status = 0
        self.log: dict[str, Any] | None = None     # access-log record being built (generation routes)
        self.error_type: str | None = None
        # our protocol's cycle (protocol.CYCLE: respond, write_chunk, whole_body), or None elsewhere
        self.cycle = cycle
        tp = headers.get(b"traceparent")
        self.trace = None if tp is None else parse_traceparent(tp, headers.get(b"tracestate"))


class Flight:
    """One generation request in flight: what the disconnect hook and the drain act on."""

    __slots__ = ("rid", "engine", "started", "done", "gone", "shutdown")

    def __init__(self, rid: str, engine: Any) -> None:
        self.rid = rid
        self.engine = engine
        self.started = False     # handed to the engine
        self.done = False
        self.gone = False        # the client left (or stopped reading)
        self.shutdown = False    # aborted because the grace period ran out

    def on_gone(self) -> None:
        if not self.done:
            self.gone = True
            if self.started:
                self.engine.abort(self.rid)

    def abort_for_shutdown(self) -> None:
        if not self.done:
            self.shutdown = True
            if self.started:
                self.engine.abort(self.rid)
