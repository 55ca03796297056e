"""Classify TCP segments that do not advance the sequence space, as tshark's tcp.analysis does.

Follows Wireshark 4.0 packet-tcp.c tcp_analyze_sequence_number, in its order:
  * keep-alive (0-1 byte at nextseq - 1, no SYN/FIN/RST) and zero-window probes: not counted;
  * spurious retransmission: data the other side has already acknowledged;
  * fast retransmission: seq equals the other side's last ACK, after >= 2 duplicate ACKs,
    within 20 ms of the last of them;
  * out-of-order: arrives within the initial RTT (SYN -> handshake ACK; 3 ms while unknown)
    of the segment that set the highest sequence number, and does not end exactly there;
  * otherwise a retransmission.
tshark's `tcp.analysis.retransmission` includes fast and spurious retransmissions; so does
`retransmissions` here. Out-of-order segments are counted apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MOD = 2 ** 32
DEFAULT_OOO_THRESHOLD_S = 0.003
FAST_RETRANS_WINDOW_S = 0.020


def _lt(a: int, b: int) -> bool:
    return a != b and (b - a) % MOD < 2 ** 31


def _le(a: int, b: int) -> bool:
    return a == b or _lt(a, b)


@dataclass
class _Dir:
    nextseq: int | None = None
    nextseq_t: float = 0.0
    lastack: int | None = None
    lastack_t: float = 0.0
    window: int | None = None
    dupacks: int = 0


@dataclass
class SeqCounts:
    retransmissions: int = 0          # all three kinds below, like tcp.analysis.retransmission
    fast_retransmissions: int = 0
    spurious_retransmissions: int = 0
    out_of_order: int = 0


@dataclass
class SeqAnalyser:
    """Feed every segment of one connection in capture order; read `counts[side]`."""

    initial_rtt_s: float | None = None
    counts: dict[bool, SeqCounts] = field(default_factory=lambda: {True: SeqCounts(), False: SeqCounts()})
    _dirs: dict[bool, _Dir] = field(default_factory=lambda: {True: _Dir(), False: _Dir()})

    def feed(self, side: bool, t: float, seq: int, ack: int, flags: int, window: int, seglen: int) -> str | None:
        """Classify one segment from `side`; returns its kind or None (a normal segment)."""
        fwd, rev = self._dirs[side], self._dirs[not side]
        syn, fin, rst, ackf = flags & 0x02, flags & 0x01, flags & 0x04, flags & 0x10
        kind: str | None = None
        keepalive = (seglen <= 1 and fwd.nextseq is not None and seq == (fwd.nextseq - 1) % MOD
                     and not (syn or fin or rst))
        zwp = (seglen == 1 and fwd.nextseq is not None and seq == fwd.nextseq and rev.window == 0)
        # duplicate ACK bookkeeping (before the retransmission checks, as tshark does)
        if (ackf and seglen == 0 and window and window == fwd.window and seq == fwd.nextseq
                and ack == fwd.lastack and not (syn or fin or rst)):
            fwd.dupacks += 1
        elif ackf and ack != fwd.lastack:
            fwd.dupacks = 0
        if (seglen > 0 or syn or fin) and not keepalive and not zwp:
            kind = self._classify(fwd, rev, t, seq, seglen, bool(syn or fin))
            if kind is not None:
                c = self.counts[side]
                if kind == "out_of_order":
                    c.out_of_order += 1
                else:
                    c.retransmissions += 1
                    c.fast_retransmissions += kind == "fast_retransmission"
                    c.spurious_retransmissions += kind == "spurious_retransmission"
        nextseq = (seq + seglen + (1 if syn or fin else 0)) % MOD
        if not zwp and (fwd.nextseq is None or _lt(fwd.nextseq, nextseq)):
            fwd.nextseq, fwd.nextseq_t = nextseq, t
        fwd.window = window
        if ackf:
            fwd.lastack, fwd.lastack_t = ack, t
        return kind

    def _classify(self, fwd: _Dir, rev: _Dir, t: float, seq: int, seglen: int, synfin: bool) -> str | None:
        not_advanced = fwd.nextseq is not None and _lt(seq, fwd.nextseq)
        if seglen > 1 and fwd.nextseq is not None and (fwd.nextseq - 1) % MOD == seq:
            not_advanced = False
        if seglen > 0 and rev.lastack is not None and _le((seq + seglen) % MOD, rev.lastack):
            return "spurious_retransmission"
        if (not_advanced and rev.dupacks >= 2 and rev.lastack == seq
                and t - rev.lastack_t < FAST_RETRANS_WINDOW_S):
            return "fast_retransmission"
        threshold = self.initial_rtt_s or DEFAULT_OOO_THRESHOLD_S
        if (not_advanced and t - fwd.nextseq_t < threshold
                and fwd.nextseq != (seq + seglen + (1 if synfin else 0)) % MOD):
            return "out_of_order"
        return "retransmission" if not_advanced else None
