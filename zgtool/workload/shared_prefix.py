"""Generated workloads whose prompts share prefixes: groups sharing a system prompt, and multi-turn
conversations whose every turn resends the history.

shared-prefix:groups=G,prefix=L,suffix=S,output=O[,n=N][,seed=X]  (vLLM's prefix_repetition dataset:
num-prefixes, prefix-len, suffix-len, output-len): request i belongs to group i % G; its system message is
that group's L-token prompt, its user message S tokens unique to the request.

multi-turn:conversations=C,turns=T,input=I,output=O[,prefix=L][,seed=X]: C conversations of T turns, sent
turn by turn in rotation (every conversation's turn 1, then every turn 2, ...). Turn k sends the whole
history: [system of L tokens], user 1, assistant 1, ..., user k. The assistant turns are synthesized
(O filler tokens each), not the model's real answers, so the history is the same on every run and every
engine; each user turn is I tokens. Every request asks for O output tokens. At -c 1 turn k+1 of a
conversation is sent after turn k has answered; with -c > 1 it may start while turn k is still running
(more conversations than -c makes that rarer), as when a user does not wait.
"""

from __future__ import annotations

from zgtool.errors import UsageError
from zgtool.workload import textgen
from zgtool.workload.datasets import _int_opt
from zgtool.workload.model import Message, RequestSpec, Workload


def _unknown(opts: dict[str, str], what: str, allowed: str) -> None:
    if opts:
        raise UsageError(f"--dataset {what}: unknown key(s) {', '.join(opts)}; use {allowed}")


def shared_prefix(opts: dict[str, str], num_requests: int) -> Workload:
    opts = dict(opts)
    given = ",".join(f"{k}={v}" for k, v in opts.items())
    groups = _int_opt(opts, "groups", 4, "shared-prefix")
    prefix = _int_opt(opts, "prefix", 256, "shared-prefix")
    suffix = _int_opt(opts, "suffix", 32, "shared-prefix")
    output = _int_opt(opts, "output", 16, "shared-prefix")
    n = _int_opt(opts, "n", num_requests, "shared-prefix")
    seed = _int_opt(opts, "seed", 0, "shared-prefix", minimum=0)
    _unknown(opts, "shared-prefix", "groups=, prefix=, suffix=, output=, n=, seed=")
    systems = [textgen.text(prefix, f"prefix-{seed}-{g}") for g in range(groups)]
    specs = tuple(RequestSpec((("system", systems[i % groups]),
                               ("user", textgen.text(suffix, f"suffix-{seed}-{i}"))), output)
                  for i in range(n))
    return Workload("shared-prefix", f"shared-prefix:{given}", specs,
                    notes=(f"{groups} group(s) sharing a {prefix}-token system prompt, {suffix} unique tokens "
                           "per request",))


def multi_turn(opts: dict[str, str]) -> Workload:
    opts = dict(opts)
    given = ",".join(f"{k}={v}" for k, v in opts.items())
    convs = _int_opt(opts, "conversations", 4, "multi-turn")
    turns = _int_opt(opts, "turns", 3, "multi-turn")
    inp = _int_opt(opts, "input", 32, "multi-turn")
    output = _int_opt(opts, "output", 16, "multi-turn")
    prefix = _int_opt(opts, "prefix", 0, "multi-turn", minimum=0)
    seed = _int_opt(opts, "seed", 0, "multi-turn", minimum=0)
    _unknown(opts, "multi-turn", "conversations=, turns=, input=, output=, prefix=, seed=")
    history: list[list[Message]] = []
    for c in range(convs):
        start: list[Message] = [("system", textgen.text(prefix, f"mt-system-{seed}-{c}"))] if prefix else []
        history.append(start)
    specs: list[RequestSpec] = []
    for k in range(turns):
        for c in range(convs):
            history[c].append(("user", textgen.text(inp, f"mt-user-{seed}-{c}-{k}")))
            specs.append(RequestSpec(tuple(history[c]), output))
            history[c].append(("assistant", textgen.text(output, f"mt-assistant-{seed}-{c}-{k}")))
    return Workload("multi-turn", f"multi-turn:{given}", tuple(specs),
                    notes=(f"{convs} conversation(s) x {turns} turn(s), each turn resending the history "
                           "(assistant turns synthesized)",))
