"""--dataset SPEC -> Workload: the one entry the commands call (before anything is sent)."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from zgtool.errors import UsageError
from zgtool.workload.model import Workload

HELP = ("Workload instead of one prompt: FILE (ShareGPT JSON/JSONL, JSONL of {prompt|messages, output_len}, "
        "or a Mooncake trace, told apart by their fields), sharegpt:FILE, jsonl:FILE, "
        "trace:FILE[,block=512] (replayed at its timestamps, see --speedup), "
        "synthetic:input=DIST,output=DIST[,n=N,seed=S] with DIST fixed:N | uniform:LO:HI | "
        "normal:MEAN:STD[:MIN[:MAX]] (GuideLLM's prompt_tokens=,output_tokens=,..._stdev/_min/_max also), "
        "shared-prefix:groups=G,prefix=L,suffix=S,output=O, multi-turn:conversations=C,turns=T,input=I,output=O, "
        "access-log:FORMAT:PATH (a gateway's access log, FORMAT nginx|envoy|litellm, replayed at its arrival "
        "times and sizes). "
        "Lengths are in tokens (one filler word per token; ShareGPT answers: chars/4), or counted by --tokenizer.")

FILE_KINDS = ("sharegpt", "jsonl", "trace")
GEN_KINDS = ("synthetic", "shared-prefix", "multi-turn")
LOG_KIND = "access-log"
# every form SPEC takes: (kind, grammar, what it is, an example), the help's epilog; each example is parsed by
# the tests, and every kind load_workload() reads has a form here (tests/cli/test_dataset_epilog.py)
FORMS: tuple[tuple[str, str, str, str], ...] = (
    ("FILE", "FILE", "ShareGPT, JSONL of {prompt|messages, output_len} or a Mooncake trace",
     "sharegpt.json"),
    ("sharegpt", "sharegpt:FILE", "ShareGPT conversations: the first human turn, the answer's length",
     "sharegpt:ShareGPT_V3.json"),
    ("jsonl", "jsonl:FILE", "one {prompt|messages, output_len} per line (no length: --max-tokens)",
     "jsonl:prompts.jsonl"),
    ("trace", "trace:FILE[,block=512][,speedup=X]", "a Mooncake trace replayed at its timestamps (see --speedup)",
     "trace:mooncake.jsonl,speedup=2"),
    ("synthetic", "synthetic:input=DIST,output=DIST[,n=N,seed=S]", "DIST: fixed:N | uniform:LO:HI | "
     "normal:MEAN:STD[:MIN[:MAX]]", "synthetic:input=uniform:64:512,output=fixed:32,n=200"),
    ("synthetic", "synthetic:prompt_tokens=N,output_tokens=N[,..._stdev/_min/_max]", "the same in GuideLLM's keys",
     "synthetic:prompt_tokens=256,output_tokens=16"),
    ("shared-prefix", "shared-prefix:groups=G,prefix=L,suffix=S,output=O[,n=N,seed=S]", "G system prompts of L "
     "tokens, each request one and its own suffix", "shared-prefix:groups=4,prefix=512,suffix=64,output=16"),
    ("multi-turn", "multi-turn:conversations=C,turns=T,input=I,output=O[,prefix=L,seed=S]", "C conversations of T "
     "turns, each turn resending the history", "multi-turn:conversations=8,turns=4,input=64,output=16"),
    (LOG_KIND, "access-log:FORMAT:PATH", "a gateway's log (nginx|envoy|litellm) replayed "
     "at its times and sizes", "access-log:nginx:/var/log/nginx/access.log"),
)


def epilog() -> str:
    """The workload grammar in full, one example per form (a command's help epilog; click keeps a \\b block)."""
    lines = ["\b", "Workload forms (--dataset SPEC), one example each:"]
    for _, grammar, what, example in FORMS:
        lines += [f"  {grammar}", f"    {what}", f"    --dataset {example}"]
    lines.append("Lengths in tokens (a filler word each), or as --tokenizer counts them.")
    return "\n".join(lines)
_KV = re.compile(r"^[A-Za-z_]+=")


def _options(text: str, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key or not value:
            raise UsageError(f"--dataset {what}: expected key=value, not {part!r}")
        out[key.strip()] = value.strip()
    return out


def _file_and_options(rest: str, what: str) -> tuple[Path, dict[str, str]]:
    parts = rest.split(",")
    k = len(parts)
    while k > 1 and _KV.match(parts[k - 1].strip()):
        k -= 1
    path = ",".join(parts[:k]).strip()
    if not path:
        raise UsageError(f"--dataset {what}: give a file, e.g. {what}:data.jsonl")
    return Path(path).expanduser(), _options(",".join(parts[k:]), what)


def load_workload(spec: str, *, num_requests: int = 50, max_tokens: int = 16, speedup: float = 1.0) -> Workload:
    """Parse and load SPEC (see HELP). `num_requests` sizes the generators that are not given n=;
    `max_tokens` applies to JSONL rows without an output length; `speedup` divides a trace's offsets."""
    from zgtool.workload import datasets, shared_prefix, trace
    from zgtool.workload.rows import read_rows

    spec = spec.strip()
    if not spec:
        raise UsageError("--dataset is empty; give a file or a generator like synthetic:input=fixed:128,output=fixed:16")
    kind, sep, rest = spec.partition(":")
    if sep and kind == LOG_KIND:
        from zgtool.workload.logreplay import load

        return load(rest, speedup=speedup, max_tokens=max_tokens)
    if sep and kind in GEN_KINDS:
        opts = _options(rest, kind)
        if kind == "synthetic":
            return datasets.synthetic(opts, num_requests)
        if kind == "shared-prefix":
            return shared_prefix.shared_prefix(opts, num_requests)
        return shared_prefix.multi_turn(opts)
    if not (sep and kind in FILE_KINDS):
        kind, rest = "auto", spec
    path, opts = _file_and_options(rest, kind)
    block = opts.pop("block", None)
    if "speedup" in opts:
        try:
            speedup = float(opts.pop("speedup"))
        except ValueError:
            raise UsageError(f"--dataset {spec}: speedup must be a number") from None
    if opts:
        raise UsageError(f"--dataset {spec}: unknown option(s) {', '.join(opts)} (a trace takes block=, speedup=)")
    rows = read_rows(path)
    if kind == "auto":
        first = rows[0][1]
        kind = ("sharegpt" if "conversations" in first or "conversation" in first
                else "trace" if "input_length" in first else "jsonl")
    if block is not None and kind != "trace":
        raise UsageError(f"--dataset {spec}: block= applies to a trace only")
    if kind == "sharegpt":
        return datasets.sharegpt(path, rows)
    if kind == "jsonl":
        return datasets.plain(path, max_tokens, rows)
    try:
        block_size = int(block) if block is not None else trace.BLOCK_SIZE
    except ValueError:
        raise UsageError(f"--dataset {spec}: block must be a whole number of tokens") from None
    return trace.load(path, speedup=speedup, block_size=block_size, rows=rows)


@lru_cache(maxsize=8)
def load_cached(spec: str, num_requests: int = 50, max_tokens: int = 16) -> Workload:
    """load_workload, once per arguments in a process (verify checks --dataset up front, then each stage
    asks again with the same arguments)."""
    return load_workload(spec, num_requests=num_requests, max_tokens=max_tokens)
