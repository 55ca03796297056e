"""Datasets: ShareGPT conversations, plain JSONL rows, and synthetic input/output length distributions.

ShareGPT (vLLM's --dataset-name sharegpt): a JSON array or JSONL of {"conversations": [{"from": "human",
"value": ...}, {"from": "gpt", "value": ...}, ...]}; the first human turn is the prompt, the gpt turn after
it the reference answer, whose length in tokens (ceil(chars / 4), textgen.approx_tokens; under --tokenizer, counted
with it: zgtool.workload.tokens) is the request's
max_tokens. Rows with no human turn followed by a gpt turn are skipped, as vLLM skips conversations with
fewer than two turns, and counted in the workload's notes.

Turns may also be spelled {"role": "user", "content": ...}. Rows are used in file order (vLLM shuffles
them by default), request i taking row i mod N.

Plain rows: {"prompt": TEXT, "output_len": N} or {"messages": [{"role", "content"}...], "output_len": N}
("text" or "input" are read as prompt, "max_tokens" or "output_tokens" as output_len; without one, the
command's --max-tokens applies).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zgtool.errors import UsageError
from zgtool.workload import textgen
from zgtool.workload.model import ROLES, Message, RequestSpec, Workload, bad_row
from zgtool.workload.rows import read_rows

HUMAN = ("human", "user")
GPT = ("gpt", "assistant", "chatgpt", "bard", "bing")
PROMPT_KEYS = ("prompt", "text", "input")      # the column names GuideLLM tries first


def _length(path: str, line: int, row: dict[str, Any], keys: tuple[str, ...], default: int | None) -> int | None:
    for key in keys:
        if key in row:
            value = row[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad_row(path, line, f"{key} must be a whole number, not {value!r}")
            if value < 1:
                raise bad_row(path, line, f"{key} must be at least 1, not {value}")
            return value
    return default


def sharegpt(path: Path, rows: list[tuple[int, Any]] | None = None) -> Workload:
    rows = rows if rows is not None else read_rows(path)
    specs: list[RequestSpec] = []
    skipped = 0
    for line, row in rows:
        conv = row.get("conversations", row.get("conversation"))
        if not isinstance(conv, list):
            raise bad_row(str(path), line, "no 'conversations' list (ShareGPT rows are "
                          "{\"conversations\": [{\"from\": \"human\", \"value\": ...}, ...]})")
        prompt = answer = None
        for i, turn in enumerate(conv):
            value = turn.get("value", turn.get("content")) if isinstance(turn, dict) else None
            if not isinstance(value, str):
                raise bad_row(str(path), line, f"conversations[{i}] needs a 'from' and a text 'value'")
            who = str(turn.get("from", turn.get("role", ""))).lower()
            if prompt is None and who in HUMAN and value.strip():
                prompt = value
            elif prompt is not None and who in GPT:
                answer = value
                break
        if prompt is None or answer is None:
            skipped += 1
            continue
        specs.append(RequestSpec((("user", prompt),), max(1, textgen.approx_tokens(answer)),
                                 reference_output=answer))
    if not specs:
        raise bad_row(str(path), rows[0][0], "no conversation has a human turn followed by a gpt turn")
    notes = (f"{skipped} conversation(s) without a human turn and a gpt answer skipped",) if skipped else ()
    return Workload("sharegpt", path.name, tuple(specs), notes=notes)


def _messages(path: str, line: int, raw: Any) -> tuple[Message, ...]:
    if not isinstance(raw, list) or not raw:
        raise bad_row(path, line, "'messages' must be a non-empty list of {\"role\", \"content\"}")
    out: list[Message] = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise bad_row(path, line, f"messages[{i}] needs a role ({', '.join(ROLES)}) and a text content")
        out.append((m["role"], m["content"]))
    if not any(role == "user" and text.strip() for role, text in out):
        raise bad_row(path, line, "the messages have no user message with text (no prompt)")
    return tuple(out)


def plain(path: Path, default_max_tokens: int, rows: list[tuple[int, Any]] | None = None) -> Workload:
    rows = rows if rows is not None else read_rows(path)
    specs: list[RequestSpec] = []
    for line, row in rows:
        if "messages" in row:
            messages = _messages(str(path), line, row["messages"])
        elif (text := next((row[k] for k in PROMPT_KEYS if isinstance(row.get(k), str) and row[k].strip()),
                           None)) is not None:
            messages = (("user", text),)
        else:
            raise bad_row(str(path), line, "the row has no prompt: give \"prompt\": TEXT or \"messages\": [...]")
        n = _length(str(path), line, row, ("output_len", "max_tokens", "output_tokens"), default_max_tokens)
        assert n is not None
        specs.append(RequestSpec(messages, n))
    return Workload("jsonl", path.name, tuple(specs))


# -- synthetic lengths ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Dist:
    """A length distribution in tokens: fixed:N, uniform:LO:HI, normal:MEAN:STD[:MIN[:MAX]] (clamped)."""

    kind: str
    a: float
    b: float = 0.0
    lo: int = 1
    hi: int = 1 << 20

    @classmethod
    def parse(cls, text: str, what: str) -> Dist:
        parts = text.split(":")
        try:
            nums = [float(p) for p in parts[1:]]
        except ValueError:
            raise UsageError(f"--dataset synthetic {what}={text!r}: the numbers are not numbers") from None
        kind = parts[0]
        if kind == "fixed" and len(nums) == 1:
            d = cls("fixed", nums[0], lo=int(nums[0]), hi=int(nums[0]))
        elif kind == "uniform" and len(nums) == 2:
            d = cls("uniform", nums[0], nums[1], lo=int(nums[0]), hi=int(nums[1]))
        elif kind == "normal" and 2 <= len(nums) <= 4:
            lo = int(nums[2]) if len(nums) > 2 else 1
            hi = int(nums[3]) if len(nums) > 3 else int(nums[0] + 4 * nums[1])
            d = cls("normal", nums[0], nums[1], lo=lo, hi=hi)
        else:
            raise UsageError(f"--dataset synthetic {what}={text!r}: expected fixed:N, uniform:LO:HI or "
                             "normal:MEAN:STD[:MIN[:MAX]]")
        if d.lo < 1 or d.hi < d.lo or d.a < 0 or d.b < 0:
            raise UsageError(f"--dataset synthetic {what}={text!r}: lengths must be >= 1 and bounds ordered "
                             "(a negative length or an empty range)")
        return d

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.lo
        if self.kind == "uniform":
            return rng.randint(self.lo, self.hi)
        return min(self.hi, max(self.lo, round(rng.gauss(self.a, self.b))))

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{self.lo}"
        if self.kind == "uniform":
            return f"uniform:{self.lo}:{self.hi}"
        return f"normal:{self.a:g}:{self.b:g}:{self.lo}:{self.hi}"


def _guidellm(opts: dict[str, str], side: str) -> str | None:
    """GuideLLM's synthetic keys (prompt_tokens, prompt_tokens_stdev/_min/_max, output_tokens...) -> Dist text."""
    mean = opts.pop(f"{side}_tokens", None)
    stdev = opts.pop(f"{side}_tokens_stdev", None)
    lo = opts.pop(f"{side}_tokens_min", None)
    hi = opts.pop(f"{side}_tokens_max", None)
    if mean is None:
        return None
    if stdev is None:                  # GuideLLM: no spread, every request the mean
        return f"fixed:{mean}"
    return f"normal:{mean}:{stdev}:{lo or 1}" + (f":{hi}" if hi else "")


def synthetic(opts: dict[str, str], num_requests: int) -> Workload:
    """input=DIST,output=DIST[,n=N][,seed=S]; or GuideLLM's prompt_tokens=..,output_tokens=.. keys.
    Prompts are filler words (one per token, textgen), different for every request."""
    opts = dict(opts)
    given = ",".join(f"{k}={v}" for k, v in opts.items())
    inp = opts.pop("input", None) or _guidellm(opts, "prompt")
    out = opts.pop("output", None) or _guidellm(opts, "output")
    n = _int_opt(opts, "n", num_requests, "synthetic")
    n = _int_opt(opts, "samples", n, "synthetic")
    seed = _int_opt(opts, "seed", 0, "synthetic", minimum=0)
    if opts:
        raise UsageError(f"--dataset synthetic: unknown key(s) {', '.join(opts)}; use input=, output=, n=, seed=")
    if inp is None or out is None:
        raise UsageError("--dataset synthetic needs input=DIST and output=DIST, e.g. "
                         "synthetic:input=fixed:128,output=uniform:16:64")
    din, dout = Dist.parse(inp, "input"), Dist.parse(out, "output")
    rng = random.Random(seed)
    specs = []
    for i in range(n):
        n_in, n_out = din.sample(rng), dout.sample(rng)
        specs.append(RequestSpec((("user", textgen.text(n_in, f"synthetic-{seed}-{i}")),), n_out, n_in))
    return Workload("synthetic", f"synthetic:{given}", tuple(specs),
                    notes=(f"input {din}, output {dout} tokens, seed {seed}",))


def _int_opt(opts: dict[str, str], key: str, default: int, what: str, minimum: int = 1) -> int:
    if key not in opts:
        return default
    raw = opts.pop(key)
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"--dataset {what}: {key}={raw!r} is not a whole number") from None
    if value < minimum:
        raise UsageError(f"--dataset {what}: {key} must be at least {minimum}, not {value}")
    return value
