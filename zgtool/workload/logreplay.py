"""`--dataset access-log:FORMAT:PATH[,speedup=F]`: a gateway's access log (zgtool.workload.accesslog) as a
workload replayed open-loop at its arrival times, each request sized as logged.

Sizes: prompt tokens where the log counts them (LiteLLM); else from the request's logged bytes (nginx
$request_length, Envoy's bytes received) less REQUEST_OVERHEAD_BYTES of headers and JSON envelope, at
BYTES_PER_TOKEN (the chars/4 rule this project uses for ShareGPT answers); else DEFAULT_INPUT_TOKENS. Output:
the completion tokens where logged (LiteLLM), else --max-tokens. Each rule used is named in the notes.
"""

from __future__ import annotations

from pathlib import Path

from zgtool.errors import UsageError
from zgtool.workload import textgen
from zgtool.workload.accesslog import FORMATS, AccessLog, LogEntry, read
from zgtool.workload.model import RequestSpec, Workload

REQUEST_OVERHEAD_BYTES = 250
BYTES_PER_TOKEN = 4
DEFAULT_INPUT_TOKENS = 32


def _input_tokens(e: LogEntry) -> tuple[int, str]:
    if e.prompt_tokens:
        return e.prompt_tokens, "logged prompt tokens"
    if e.request_bytes is not None:
        return max(1, (e.request_bytes - REQUEST_OVERHEAD_BYTES) // BYTES_PER_TOKEN), "request bytes"
    return DEFAULT_INPUT_TOKENS, "default"


def parse_spec(rest: str) -> tuple[str, Path, float | None]:
    """'FORMAT:PATH[,speedup=F]' -> (format, path, speedup or None)."""
    fmt, sep, tail = rest.partition(":")
    if not sep or fmt not in FORMATS or not tail:
        raise UsageError(f"--dataset access-log:{rest}: give access-log:FORMAT:PATH with FORMAT one of "
                         f"{', '.join(FORMATS)}")
    path, _, opt = tail.partition(",speedup=")
    speedup = None
    if opt:
        try:
            speedup = float(opt)
        except ValueError:
            raise UsageError(f"--dataset access-log:{rest}: speedup must be a number") from None
    return fmt, Path(path).expanduser(), speedup


def workload(log: AccessLog, *, speedup: float = 1.0, max_tokens: int = 16) -> Workload:
    if not speedup > 0:
        raise UsageError(f"--speedup must be positive, not {speedup}")
    specs = []
    sources: dict[str, int] = {}
    for e in log.entries:
        n_in, how = _input_tokens(e)
        sources[how] = sources.get(how, 0) + 1
        specs.append(RequestSpec((("user", textgen.text(n_in, f"access-log-{e.line}")),),
                                 e.completion_tokens or max_tokens, input_tokens=n_in))
    t0 = log.entries[0].start_s
    offsets = tuple((e.start_s - t0) / speedup for e in log.entries)
    notes = [f"{log.format} access log replayed at its arrival times x{speedup:g} speed-up"]
    if log.format == "nginx":
        notes.append("nginx's $time_local has whole seconds: the requests that ended within one second are "
                     "spread evenly over it, each arrival that end less its $request_time")
    notes.append("prompt sizes from " + ", ".join(f"{how} ({n})" for how, n in sources.items())
                 + (f" ({BYTES_PER_TOKEN} bytes a token after {REQUEST_OVERHEAD_BYTES} bytes of envelope)"
                    if "request bytes" in sources else ""))
    logged_out = sum(1 for e in log.entries if e.completion_tokens)
    notes.append(f"output: logged completion tokens ({logged_out})" if logged_out == len(log.entries)
                 else f"output: max_tokens {max_tokens} where the log has no completion tokens "
                      f"({len(log.entries) - logged_out})")
    if (skipped := log.skipped_note()) is not None:
        notes.append(skipped)
    if log.not_llm:
        notes.append(f"{log.not_llm} non-POST line(s) left out")
    return Workload("access-log", f"access-log:{log.format}:{log.path.name}", tuple(specs), offsets_s=offsets,
                    notes=tuple(notes))


def load(rest: str, *, speedup: float = 1.0, max_tokens: int = 16) -> Workload:
    fmt, path, given = parse_spec(rest)
    return workload(read(fmt, path), speedup=given if given is not None else speedup, max_tokens=max_tokens)
