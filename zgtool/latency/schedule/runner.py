"""Run a latency split: check every target is reachable, warm up, then measure in rounds.

Targets alternate block-wise (A B, B A, A B, ...) so slow drift of the machine is shared
evenly instead of landing on whichever target ran last. Every block opens its -c sessions anew:
what one connection happens to get (a server thread, its socket's way through the kernel) then
varies from round to round and the round bootstrap sees it, instead of one path carrying it for
the whole run (issue 25: A/A runs called ~10% of identical paths different). With keep-alive,
each fresh session first sends one unmeasured request (outside the block's timed window and CPU
reading), so every measured request is a steady-state one on a warm connection, as before; the
connect is then measured only with --new-connection (where every request pays it).
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Sequence
from time import perf_counter_ns

from zgtool.errors import TargetUnreachable
from zgtool.latency.config import SplitConfig
from zgtool.latency.records import RequestHook, RequestSample
from zgtool.latency.schedule.cputime import CpuWatch
from zgtool.latency.schedule.openloop import OpenLoop, OpenLoopLog
from zgtool.latency.wire.client import Endpoint, Session, is_ip_literal, ssl_context
from zgtool.targets import Target

Progress = Callable[[str, int, int], None]


def preflight(target: Target, cfg: SplitConfig, ctx: ssl.SSLContext | None) -> int:
    """Resolve, connect (and handshake for https) once; return the address family that works.

    Raises TargetUnreachable naming the target, so nothing is measured against a dead one.
    """
    host, port = target.host, target.port
    try:
        infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except OSError as exc:
        raise TargetUnreachable(f"target {target.name!r}: cannot resolve {host}: {exc}") from exc
    last: Exception | None = None
    for family, _type, proto, _canon, addr in infos:
        sock = socket.socket(family, socket.SOCK_STREAM, proto)
        sock.settimeout(min(cfg.timeout_s, 10.0))
        try:
            sock.connect(addr)
        except OSError as exc:
            last = exc
            sock.close()
            continue
        try:
            if target.scheme == "https" and ctx is not None:
                with ctx.wrap_socket(sock, server_hostname=host):
                    pass
        except ssl.SSLError as exc:
            hint = " (use --cacert FILE or --insecure for a self-signed certificate)" \
                if "CERTIFICATE_VERIFY_FAILED" in str(exc) else ""
            raise TargetUnreachable(f"target {target.name!r}: TLS handshake with {host}:{port} failed: "
                                    f"{exc.reason or exc}{hint}") from exc
        except OSError as exc:
            raise TargetUnreachable(f"target {target.name!r}: TLS handshake with {host}:{port} failed: "
                                    f"{exc}") from exc
        finally:
            sock.close()
        return family if not is_ip_literal(host) else socket.AF_UNSPEC
    raise TargetUnreachable(f"target {target.name!r}: cannot connect to {host}:{port}: {last}")


class MeasureInterrupted(KeyboardInterrupt):
    """Ctrl-C during the measured rounds, carrying every request that finished (per target, by index), so
    the command can still write and summarise them."""

    def __init__(self, samples: list[list[RequestSample]]) -> None:
        super().__init__()
        self.samples = samples


def _timed_out(sample: RequestSample) -> bool:
    return (sample.error or "").startswith("timeout:")


def _split(n: int, parts: int) -> list[int]:
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


class _Block:
    """`count` requests to one target over `workers` threads; indices handed out in order."""

    def __init__(self, sessions: list[Session], first_index: int, count: int, rnd: int,
                 t_run0_ns: int, out: list[RequestSample], hook: RequestHook | None = None,
                 on_sample: Callable[[RequestSample], None] | None = None,
                 halt: Callable[[RequestSample], bool] | None = None) -> None:
        self.sessions = sessions
        self.halt = halt            # a sample for which it is true stops the block handing out more
        self.hook = hook
        self.on_sample = on_sample  # the live progress line: called after each measured request
        self.next = first_index
        self.stop = first_index + count
        self.rnd = rnd
        self.t_run0_ns = t_run0_ns
        self.out = out
        self.lock = threading.Lock()

    def _take(self) -> int | None:
        with self.lock:
            if self.next >= self.stop:
                return None
            i = self.next
            self.next += 1
            return i

    def work(self, worker: int) -> None:
        session = self.sessions[worker]
        while (i := self._take()) is not None:
            token = self.hook.before() if self.hook is not None else None
            sample = session.measure(i, worker, self.rnd, self.t_run0_ns)
            if self.hook is not None:
                self.hook.after(token, sample)
            with self.lock:
                self.out.append(sample)
                if self.halt is not None and self.halt(sample):
                    self.stop = self.next
            if self.on_sample is not None:
                self.on_sample(sample)

    def run(self) -> None:
        workers = min(len(self.sessions), self.stop - self.next)
        if workers <= 1:
            # c=1 runs on this thread: no hand-off, nothing between the client and its clock
            self.work(0)
            return
        threads = [threading.Thread(target=self.work, args=(w,), daemon=True) for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def _unmeasured(hook: RequestHook | None, send: Callable[[], list[RequestSample]]) -> list[RequestSample]:
    """Requests sent but not measured (warm-ups), through the target's hook when it has one."""
    return hook.unmeasured(send) if hook is not None else send()


def _fresh_sessions(ep: Endpoint, cfg: SplitConfig, ctx: ssl.SSLContext | None, t_run0_ns: int,
                    hook: RequestHook | None = None) -> list[Session]:
    """A block's -c sessions, each with a warm connection when keep-alive is on (one unmeasured request
    each, sent together, so the block's first requests do not carry a connect the rest do not)."""
    sessions = [Session(ep, cfg, ctx) for _ in range(cfg.concurrency)]
    if cfg.new_connection:
        return sessions

    def warm() -> list[RequestSample]:
        if len(sessions) == 1:
            return [sessions[0].measure(-1, 0, -1, t_run0_ns)]
        out: list[RequestSample] = []

        def one(worker: int, session: Session) -> None:
            out.append(session.measure(-1, worker, -1, t_run0_ns))

        threads = [threading.Thread(target=one, args=(w, s), daemon=True) for w, s in enumerate(sessions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    _unmeasured(hook, warm)
    return sessions


def measure_targets(targets: Sequence[Target], cfg: SplitConfig,
                    progress: Progress | None = None, cpu: CpuWatch | None = None,
                    hooks: Sequence[RequestHook | None] | None = None,
                    open_loop: OpenLoopLog | None = None,
                    on_sample: Callable[[RequestSample], None] | None = None,
                    t_run0_ns: int | None = None) -> list[list[RequestSample]]:
    """Samples per target (same order as `targets`), each sorted by request index, measured with the packet
    clock on the targets' ports where this process may open one (zgtool.latency.wire.pktclock; why not is
    kept in pktclock.CURRENT.why_not and said once in the result's notes). `t_run0_ns` (perf_counter_ns):
    the origin of the samples' start_s, when a caller shares it (--scrape's time series); else the run's start."""
    from zgtool.latency.wire.pktclock import running

    with running(sorted({t.port for t in targets})):
        return _measure(targets, cfg, progress, cpu, hooks, open_loop, on_sample, t_run0_ns)


def _measure(targets: Sequence[Target], cfg: SplitConfig,
             progress: Progress | None = None, cpu: CpuWatch | None = None,
             hooks: Sequence[RequestHook | None] | None = None,
             open_loop: OpenLoopLog | None = None,
             on_sample: Callable[[RequestSample], None] | None = None,
             t_run0_ns: int | None = None) -> list[list[RequestSample]]:
    """Samples per target (same order as `targets`), each sorted by request index.

    With cfg.rate_rps or cfg.schedule_s each block is sent open-loop (zgtool.latency.schedule.openloop) on its
    own schedule; `open_loop` then receives what the dispatcher saw per target (its CPU time, pool size).

    With `cpu`, the CPU time of its process groups is read before and after every block
    (outside the timed requests) and accumulated for the block's target."""
    ctx = ssl_context(cfg.verify) if any(t.scheme == "https" for t in targets) else None
    families = [preflight(t, cfg, ctx) for t in targets]
    endpoints = [Endpoint.build(t, cfg, fam) for t, fam in zip(targets, families, strict=True)]
    t_run0 = t_run0_ns if t_run0_ns is not None else perf_counter_ns()
    if cfg.warmup:
        for ti, (target, ep) in enumerate(zip(targets, endpoints, strict=True)):
            # warm-up sessions are thrown away: every block opens (and warms) its own
            warm = [Session(ep, cfg, ctx) for _ in range(min(cfg.concurrency, cfg.warmup))]
            warm_out: list[RequestSample] = []

            def send(warm: list[Session] = warm, out: list[RequestSample] = warm_out) -> list[RequestSample]:
                _Block(warm, 0, cfg.warmup, -1, t_run0, out, halt=_timed_out).run()
                return out

            try:
                _unmeasured(hooks[ti] if hooks else None, send)
            finally:
                for s in warm:
                    s.close()
            if any(_timed_out(s) for s in warm_out):
                # a server that accepts and never answers would cost every request its timeout, silently
                raise TargetUnreachable(f"target {target.name!r}: no answer to the warm-up request within "
                                        f"{cfg.timeout_s:g} s: the server accepts connections but does not "
                                        "answer; stopped here (--timeout-s sets the wait)")
    loop = OpenLoop(endpoints, [t.name for t in targets], cfg, ctx, t_run0, hooks, open_loop) \
        if cfg.open_loop else None
    keep = loop is None and not cfg.fresh_connections
    sessions = [[Session(ep, cfg, ctx) for _ in range(cfg.concurrency)] for ep in endpoints] if keep else []
    samples: list[list[RequestSample]] = [[] for _ in targets]
    done = [0 for _ in targets]
    rounds = cfg.effective_rounds
    try:
        for rnd, count in enumerate(_split(cfg.num_requests, rounds)):
            order = list(range(len(targets)))
            if rnd % 2:
                order.reverse()
            for ti in order:
                fresh = [] if keep or loop is not None else _fresh_sessions(endpoints[ti], cfg, ctx, t_run0,
                                                                             hooks[ti] if hooks else None)
                if cpu is not None:
                    cpu.begin()
                if loop is not None:
                    loop.run_block(ti, done[ti], count, rnd, samples[ti])
                else:
                    try:
                        _Block(sessions[ti] if keep else fresh, done[ti], count, rnd, t_run0, samples[ti],
                               hooks[ti] if hooks else None, on_sample).run()
                    finally:
                        for s in fresh:
                            s.close()
                if cpu is not None:
                    cpu.end(targets[ti].name, count)
                done[ti] += count
                if progress is not None:
                    progress(targets[ti].name, done[ti], cfg.num_requests)
    except KeyboardInterrupt:
        finished = [sorted(list(per), key=lambda s: s.index) for per in samples]
        raise MeasureInterrupted(finished) from None
    finally:
        if loop is not None:
            loop.close()
        for per_target in sessions:
            for s in per_target:
                s.close()
    for target_samples in samples:
        target_samples.sort(key=lambda s: s.index)
    return samples
