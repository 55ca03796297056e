"""In-pipeline safety: deny phrases/regexes for input and output (see examples/safety-policy.toml).

Input is checked once before scheduling. Output is checked incrementally inside the
engine's step thread (the engine's ``output_filter`` hook, zgtool.engine.server.safetytext):
each call looks only at the text that can contain a new match, so a long answer costs
O(new text) per token, and the stream sends only text that can no longer start a match.
Both sides match on text normalised by one per-character function (safetytext.norm_char:
NFKD, every default-ignorable/format/mark code point removed, whitespace folded, case folded
unless ``case_sensitive``; look-alike letters folded to ASCII where a section sets
``fold_confusables = true``); text with controls, noncharacters, private-use, unassigned code
points or line/paragraph separators is matched with each as a space and with each removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import regex

from zgtool.engine.server.safetytext import OutputFilter, OutputRules, forms, normalize
from zgtool.errors import UsageError
from zgtool.http.toml import load_toml

DEFAULT_MESSAGE = "the request was blocked by the server's content policy"


@dataclass(frozen=True)
class Rules:
    phrases: tuple[str, ...] = ()        # normalised (and lower-cased unless case_sensitive)
    regexes: tuple[Any, ...] = ()        # regex.Pattern
    fold_confusables: bool = False       # match on text with confusables folded to ASCII (and rules too)

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
        for norm in forms(text, not self.case_sensitive, self.input.fold_confusables):
            for p in self.input.phrases:
                if p in norm:
                    return f"{self.message} (input matched a denied phrase)"
            for rx in self.input.regexes:
                if rx.search(norm):
                    return f"{self.message} (input matched a denied pattern)"
        return None

    def output_filter(self) -> OutputFilter | None:
        """A fresh per-request filter for Engine.add_request, or None when there are no output rules."""
        if self.output.empty:
            return None
        return OutputFilter(self._output_rules, self._prefixes)

    @property
    def _output_rules(self) -> OutputRules:
        rules = self.__dict__.get("_rules_cache")
        if rules is None:
            rules = OutputRules(self.output.phrases, self.output.regexes, not self.case_sensitive,
                                self.message, self.regex_lookback_chars, self.output.fold_confusables)
            object.__setattr__(self, "_rules_cache", rules)
        return rules

    @property
    def _prefixes(self) -> frozenset[str]:
        pre = self.__dict__.get("_prefix_cache")
        if pre is None:
            pre = self._output_rules.prefixes
            object.__setattr__(self, "_prefix_cache", pre)
        return pre


def _rules(section: Any, name: str, case_sensitive: bool) -> Rules:
    if section is None:
        return Rules()
    if not isinstance(section, dict):
        raise UsageError(f"safety policy: [{name}] must be a table")
    unknown = set(section) - {"deny_phrases", "deny_regexes", "fold_confusables"}
    if unknown:
        raise UsageError(f"safety policy: [{name}] has unknown fields {sorted(unknown)}")
    phrases = section.get("deny_phrases", [])
    regexes = section.get("deny_regexes", [])
    for key, values in (("deny_phrases", phrases), ("deny_regexes", regexes)):
        if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
            raise UsageError(f"safety policy: [{name}] {key} must be a list of non-empty strings")
    confusables = section.get("fold_confusables", False)
    if not isinstance(confusables, bool):
        raise UsageError(f"safety policy: [{name}] fold_confusables must be true or false")
    flags = regex.V0 if case_sensitive else regex.V0 | regex.IGNORECASE
    compiled = []
    for rx in regexes:
        try:
            compiled.append(regex.compile(rx, flags))
        except regex.error as exc:
            raise UsageError(f"safety policy: [{name}] regex {rx!r} does not compile: {exc}") from exc
    normed = tuple(p for p in (normalize(p, not case_sensitive, confusables) for p in phrases) if p)
    return Rules(phrases=normed, regexes=tuple(compiled), fold_confusables=confusables)


def load_policy(path: Path) -> SafetyPolicy:
    data = load_toml(path, "safety policy")
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
