"""Match response headers against the signature database (signatures.json, shipped in the package).

A signature is a list of rules (header value, header-name prefix, Via hop, Server-Timing
metric names, error-body text), each with a weight; a detection's confidence combines
the weights of the rules that matched as 1 - prod(1 - w).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from zgtool.probes.servertiming import Metric
from zgtool.probes.via import ViaHop

KINDS = ("origin", "proxy", "cdn", "load_balancer", "api_gateway", "ai_gateway")
RULE_TYPES = ("header", "header_prefix", "via", "server_timing", "body")


@dataclass(frozen=True)
class Evidence:
    what: str          # e.g. "server: nginx/1.22.1", "via hop '1.1 zgtool-pygw'"
    weight: float


@dataclass
class Detection:
    id: str
    name: str
    kind: str          # one of KINDS; "origin" is the answering server, the rest are intermediaries
    confidence: float  # 0..1
    level: str         # high (>= 0.8) | medium (>= 0.5) | low
    evidence: list[Evidence] = field(default_factory=list)


def level_for(confidence: float) -> str:
    return "high" if confidence >= 0.8 else "medium" if confidence >= 0.5 else "low"


@lru_cache(maxsize=1)
def load_database() -> dict[str, Any]:
    text = resources.files("zgtool.probes").joinpath("signatures.json").read_text()
    db = json.loads(text)
    validate_database(db)
    return db


def validate_database(db: dict[str, Any]) -> None:
    """Fail loudly on a malformed data file (it is edited by hand)."""
    seen = set()
    for sig in db["signatures"]:
        sid = sig["id"]
        assert sid not in seen, f"duplicate signature id {sid}"
        seen.add(sid)
        assert sig["kind"] in KINDS, f"{sid}: unknown kind {sig['kind']}"
        assert sig["rules"], f"{sid}: no rules"
        for rule in sig["rules"]:
            types = [t for t in RULE_TYPES if t in rule]
            assert len(types) == 1, f"{sid}: a rule needs exactly one of {RULE_TYPES}: {rule}"
            assert 0 < rule["weight"] <= 1, f"{sid}: weight out of (0, 1]: {rule}"
            for key in ("pattern", "via", "server_timing", "body"):
                if key in rule:
                    re.compile(rule[key])


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


def _match_rule(rule: dict[str, Any], headers: list[tuple[str, str]], via: list[ViaHop],
                timing: list[Metric], body: str) -> str | None:
    """The evidence text when the rule matches, else None."""
    if "header" in rule:
        name = rule["header"].lower()
        for k, v in headers:
            if k.lower() == name and ("pattern" not in rule or _rx(rule["pattern"]).search(v)):
                return f"{k.lower()}: {v}"
        return None
    if "header_prefix" in rule:
        prefix = rule["header_prefix"].lower()
        names = sorted({k.lower() for k, _ in headers if k.lower().startswith(prefix)})
        return f"headers {', '.join(names)}" if names else None
    if "via" in rule:
        rx = _rx(rule["via"])
        for hop in via:
            if rx.search(hop.received_by) or (hop.comment and rx.search(f"({hop.comment})")):
                shown = " ".join(x for x in (hop.protocol, hop.received_by) if x)
                return f"via hop '{shown}{f' ({hop.comment})' if hop.comment else ''}'"
        return None
    if "server_timing" in rule:
        rx = _rx(rule["server_timing"])
        names = sorted({m.name for m in timing if rx.search(m.name)})
        if len(names) >= int(rule.get("min", 1)):
            return f"server-timing metrics {', '.join(names)}"
        return None
    if "body" in rule:
        m = _rx(rule["body"]).search(body)
        return f"body text {m.group(0).strip()[:60]!r}" if m else None
    return None


def match_signatures(headers: list[tuple[str, str]], via: list[ViaHop], timing: list[Metric],
                     body: str = "", db: dict[str, Any] | None = None) -> list[Detection]:
    """Every signature with at least one matching rule, most confident first."""
    db = db or load_database()
    found: dict[str, Detection] = {}
    for sig in db["signatures"]:
        evidence = []
        for rule in sig["rules"]:
            what = _match_rule(rule, headers, via, timing, body)
            if what is not None:
                evidence.append(Evidence(what, float(rule["weight"])))
        if not evidence:
            continue
        miss = 1.0
        for ev in evidence:
            miss *= 1.0 - ev.weight
        conf = round(1.0 - miss, 3)
        found[sig["id"]] = Detection(sig["id"], sig["name"], sig["kind"], conf, level_for(conf), evidence)
    for sig in db["signatures"]:
        if sig["id"] in found and any(u in found for u in sig.get("unless", ())):
            del found[sig["id"]]
    return sorted(found.values(), key=lambda d: (-d.confidence, d.id))


def sends_server_header(sig_id: str, db: dict[str, Any] | None = None) -> bool:
    db = db or load_database()
    return any(s["id"] == sig_id and s.get("sends_server_header") for s in db["signatures"])
