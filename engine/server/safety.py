"""In-pipeline safety: deny phrases/regexes for input and output (see examples/safety-policy.toml).

Input is checked once before scheduling. Output is checked incrementally inside the
engine's step thread (the engine's ``output_filter`` hook): each call looks only at the
text that can contain a new match, i.e. the new delta plus the longest phrase (or
``regex_lookback_chars`` for regexes) before it, so a long answer costs O(new text) per
token, not O(answer).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zgtool.errors import UsageError

DEFAULT_MESSAGE = "the request was blocked by the server's content policy"


@dataclass(frozen=True)
class Rules:
    phrases: tuple[str, ...] = ()        # stored lower-cased unless case_sensitive
    regexes: tuple[re.Pattern[str], ...] = ()

    @property
    def empty(self) -> bool:
        return not self.phrases and not self.regexes


@dataclass(frozen=True)
class SafetyPolicy:
    input: Rules
    output: Rules
    case_sensitive: bool = False
    message: str = DEFAULT_MESSAGE
    regex_lookback_chars: int = 256

    def check_input(self, text: str) -> str | None:
        """A violation message when the prompt matches, else None."""
        return _first_hit(self.input, text if self.case_sensitive else text.lower(), text, self.message, "input")

    def output_filter(self) -> Callable[[str], str | None] | None:
        """A fresh per-request filter for Engine.add_request, or None when there are no output rules."""
        if self.output.empty:
            return None
        rules = self.output
        fold = not self.case_sensitive
        phrase_back = max((len(p) for p in rules.phrases), default=1) - 1
        regex_back = self.regex_lookback_chars
        message = self.message
        checked = 0

        def check(full_text: str) -> str | None:
            nonlocal checked
            n = len(full_text)
            if n == checked:
                return None
            hit = None
            if rules.phrases:
                window = full_text[max(0, checked - phrase_back):]
                if fold:
                    window = window.lower()
                for p in rules.phrases:
                    if p in window:
                        hit = f"{message} (output matched a denied phrase)"
                        break
            if hit is None and rules.regexes:
                start = max(0, checked - regex_back)
                for rx in rules.regexes:
                    if rx.search(full_text, start):
                        hit = f"{message} (output matched a denied pattern)"
                        break
            checked = n
            return hit

        return check


def _first_hit(rules: Rules, folded: str, raw: str, message: str, where: str) -> str | None:
    for p in rules.phrases:
        if p in folded:
            return f"{message} ({where} matched a denied phrase)"
    for rx in rules.regexes:
        if rx.search(raw):
            return f"{message} ({where} matched a denied pattern)"
    return None


def _rules(section: Any, name: str, case_sensitive: bool) -> Rules:
    if section is None:
        return Rules()
    if not isinstance(section, dict):
        raise UsageError(f"safety policy: [{name}] must be a table")
    unknown = set(section) - {"deny_phrases", "deny_regexes"}
    if unknown:
        raise UsageError(f"safety policy: [{name}] has unknown fields {sorted(unknown)}")
    phrases = section.get("deny_phrases", [])
    regexes = section.get("deny_regexes", [])
    for key, values in (("deny_phrases", phrases), ("deny_regexes", regexes)):
        if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
            raise UsageError(f"safety policy: [{name}] {key} must be a list of non-empty strings")
    flags = 0 if case_sensitive else re.IGNORECASE
    compiled = []
    for rx in regexes:
        try:
            compiled.append(re.compile(rx, flags))
        except re.error as exc:
            raise UsageError(f"safety policy: [{name}] regex {rx!r} does not compile: {exc}") from exc
    return Rules(
        phrases=tuple(p if case_sensitive else p.lower() for p in phrases),
        regexes=tuple(compiled),
    )


def load_policy(path: Path) -> SafetyPolicy:
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise UsageError(f"safety policy {path} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"safety policy {path} is not valid TOML: {exc}") from exc
    case_sensitive = bool(data.get("case_sensitive", False))
    lookback = data.get("regex_lookback_chars", 256)
    if not isinstance(lookback, int) or lookback < 1:
        raise UsageError("safety policy: regex_lookback_chars must be an integer >= 1")
    policy = SafetyPolicy(
        input=_rules(data.get("input"), "input", case_sensitive),
        output=_rules(data.get("output"), "output", case_sensitive),
        case_sensitive=case_sensitive,
        message=str(data.get("message", DEFAULT_MESSAGE)),
        regex_lookback_chars=lookback,
    )
    if policy.input.empty and policy.output.empty:
        raise UsageError(f"safety policy {path} has no deny_phrases or deny_regexes in [input] or [output]")
    return policy
