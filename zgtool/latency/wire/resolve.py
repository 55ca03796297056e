"""One answer's points on the kernel's clock, resolved after the answer (never inside the timed window).

Each point (the request's first byte out, the answer's first byte, its head's end, its body's first byte, the
first token of any kind, each content token, the last byte) is known by its byte offset on the connection.
Its time is, best first:
  1. the packet clock (zgtool.latency.wire.pktclock): the segment that carried that byte, as tcpdump sees it;
  2. for the send, SO_TIMESTAMPING's transmit time of the request's first send; for a receive point, the
     SO_TIMESTAMPNS time of the read that brought it, exact when that read took one segment and otherwise
     an upper bound whose doubt is the read's `slack` (zgtool.latency.wire.transport);
  3. the client's own clock: after the send call returned, or when the read returned.
A figure is left out of its stats (samples[].unvouched) only when its doubt stays over LAG_FLAG_NS, that is
only when no kernel time for it could be had.
"""

from __future__ import annotations

import bisect

from zgtool.latency.records import RequestSample
from zgtool.latency.wire.pktclock import DOWN, UP, PacketClock
from zgtool.latency.wire.stream_reader import Points, Seen
from zgtool.latency.wire.transport import LAG_FLAG_NS, _Marks

HEADLINE = ("ttfb_ms", "ttft_ms", "total_ms")     # figures whose doubt flags the request
TOL_NS = 50_000        # a kernel time this far outside what the client saw is not believed

Point = tuple[int, int]          # (time on perf_counter ns, how much earlier the byte may have arrived)


class Resolver:
    """Times of one answer's bytes: the packet clock first, the socket's own timestamps after."""

    def __init__(self, m: _Marks, clock: PacketClock | None) -> None:
        self.m = m
        self.clock = clock if m.conn is not None and m.up_offset is not None else None
        self.from_packets = 0          # points the packet clock gave
        self.points = 0

    def sent(self) -> Point | None:
        """The request's first byte out, and its doubt."""
        m = self.m
        if m.first_write_ns is None:
            return None
        lo = m.first_write_ns - TOL_NS
        hi = (m.send_return_ns or m.first_write_ns) + TOL_NS
        if self.clock is not None and m.conn is not None and m.up_offset is not None:
            t = self.clock.time_of(*m.conn, UP, m.up_offset)
            if t is not None and lo <= t <= hi:
                return t, 0
        if m.tx_ns is not None and lo <= m.tx_ns <= hi:
            return m.tx_ns, 0
        # the bytes left during the call: after it, at the latest; unsure by the call's length
        after = m.send_return_ns or m.first_write_ns
        return after, after - m.first_write_ns

    def at(self, offset: int | None, fallback: Point | None) -> Point | None:
        """Answer byte `offset`: its segment's own time, else `fallback` (the read's time and doubt)."""
        self.points += 1
        m = self.m
        if offset is None or self.clock is None or m.conn is None or m.down_offset is None or not m.reads:
            return fallback
        read = bisect.bisect_right(m.read_at, offset) - 1
        if read < 0 or offset >= m.rx_bytes:
            return fallback
        t = self.clock.time_of(*m.conn, DOWN, m.down_offset + offset)
        # a segment arrives after the request left and no later than the read that took it says
        if t is None or not (m.first_write_ns or 0) - TOL_NS <= t <= m.arrivals[read] + TOL_NS:
            return fallback
        self.from_packets += 1
        return min(t, m.arrivals[read]), 0

    def token(self, seen: Seen | None) -> Point | None:
        if seen is None:
            return None
        m = self.m
        off = m.body.raw_of(seen.dec_end) if m.body is not None and seen.dec_end is not None else None
        return self.at(off, m.point(seen.read, at_end=seen.at_end))


def fill_points(s: RequestSample, points: Points, t0: int, m: _Marks, clock: PacketClock | None) -> None:
    """The answer's figures from its points: first byte, head complete and first body byte from the request's
    first byte out; the first token of any kind, the first content token and the last byte from the request's
    start. A figure whose doubt is over LAG_FLAG_NS goes in `unvouched` (left out of its stats); an unvouched
    ttfb, ttft or total flags the request (`lagged`, client_lag_ms the largest of their doubts)."""
    if clock is not None:
        clock.drain()
    r = Resolver(m, clock)
    out = r.sent()
    slack: dict[str, int] = {}
    if out is not None:
        s.first_byte_out_ms = (out[0] - t0) / 1e6
    head = m.head_end()
    start = [("ttfb_ms", 0, (m.first_read_ns, m.first_lag_ns) if m.first_read_ns is not None else None),
             ("ttfb_headers_ms", head, m.head_point),
             ("ttfb_body_ms", None if head is None else head + 1, m.body_point)]
    for name, off, fallback in start:
        found = r.at(off, fallback)
        if found is not None and out is not None:
            setattr(s, name, (found[0] - out[0]) / 1e6)
            slack[name] = found[1] + out[1]
    last = r.at(m.rx_bytes - 1, (m.arrivals[-1], m.end_slack[-1]))
    if last is not None:
        s.total_ms = (last[0] - t0) / 1e6
        slack["total_ms"] = last[1]
    for name, seen in (("ttft_any_ms", points.any), ("ttft_ms", points.content)):
        found = r.token(seen)
        if found is not None:
            setattr(s, name, (found[0] - t0) / 1e6)
            slack[name] = found[1]
    _fill_gaps(s, points, r)
    if r.clock is not None and m.conn is not None and m.up_offset is not None and m.down_offset is not None:
        # this answer is settled: its segments (and older ones) need not be searched again
        r.clock.forget(*m.conn, {UP: m.up_offset, DOWN: m.down_offset + m.rx_bytes})
    s.unvouched = [name for name, ns in slack.items() if ns > LAG_FLAG_NS]
    lag = max((ns for name, ns in slack.items() if name in HEADLINE), default=0)
    s.rx_clock = "packet" if clock is not None and r.from_packets == r.points else (
        "kernel" if m.kernel_rx else "client")
    s.client_lag_ms = lag / 1e6
    s.lagged = lag > LAG_FLAG_NS


def _fill_gaps(s: RequestSample, points: Points, r: Resolver) -> None:
    """ITL from the gaps whose both ends are vouched for; TPOT from the resolved first token and end."""
    if not points.tokens:
        return
    times = [r.token(seen) for seen in points.tokens]
    s.itl_ms = [(b[0] - a[0]) / 1e6 for a, b in zip(times, times[1:], strict=False)
                if a is not None and b is not None and a[1] <= LAG_FLAG_NS and b[1] <= LAG_FLAG_NS]
    s.itl_left_out = len(times) - 1 - len(s.itl_ms)
    n = s.output_tokens if s.output_tokens else len(points.tokens)
    if n > 1 and s.ttft_ms is not None and s.total_ms is not None:
        s.tpot_ms = (s.total_ms - s.ttft_ms) / (n - 1)
