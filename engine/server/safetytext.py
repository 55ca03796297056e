"""Text normalisation for safety matching and the per-request streaming output filter.

Matching runs on normalised text, so trivial edits do not bypass a rule: Unicode NFKD
(full-width letters, ligatures, NBSP -> space, accented letters -> base letter + mark), then
every invisible code point removed (Unicode Default_Ignorable_Code_Point, format characters
(Cf) and combining marks (Mn): zero-width and bidi controls, U+2062 invisible times, U+034F,
variation selectors, tag characters, U+180B, U+3164 ...), every whitespace run folded to one
space, lower-cased unless the policy is case-sensitive. Code points that are not text ("odd":
controls (Cc) other than tab, LF and CR, noncharacters, private-use and unassigned code points
(Cn, Co) and the line/paragraph separators U+2028/U+2029 (Zl, Zp)) can split a word as well as
separate two, so text holding any is matched twice: once with each odd code point as a space,
once with it removed; a rule matching either form is a match (input and output alike; the
streaming filter keeps a twin for the removed form from the first odd code point on). Rules, prompts and output go through
the same per-character function: NFKD followed by dropping marks gives the same result
character by character as on the whole string, so a decomposed "cafe\u0301" in a stream
matches a "café" rule (per-character NFKC did not compose it). Accents therefore do not
matter to a rule. A rule section with ``fold_confusables`` also maps every non-ASCII character
whose Unicode confusable prototype is one ASCII letter or digit to it (Cyrillic "а" -> "a",
engine/server/confusables.py), before case folding, still one character at a time; ASCII is
never remapped, so patterns written for ASCII keep their meaning.

``OutputFilter`` is the engine's ``output_filter`` hook (called in the step thread with
the whole output so far) and also tells the stream how much of that output is safe to
send: ``safe_chars`` ends where the longest suffix that could still start a match
begins (a phrase prefix, or a regex partial match reaching the end), so no prefix of
blocked text ever reaches the client.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import regex

from zgtool.engine.server.confusables import TO_ASCII

# invisible to a reader, so never part of what a rule matches
INVISIBLE = regex.compile(r"[\p{Default_Ignorable_Code_Point}\p{Cf}\p{Mn}]")
# ASCII that folds or is odd (whitespace other than one space, control characters)
_ASCII_SLOW = re.compile(r"[\x00-\x1f\x7f]|  ")
# not text: what an attacker can put inside a word ("ign\x01ore") or between two ("ignore\x01all")
ODD_CATEGORIES = frozenset({"Cc", "Cn", "Co", "Zl", "Zp"})
_ASCII_ODD = frozenset(chr(i) for i in [*range(0x20), 0x7F] if chr(i) not in "\t\n\r")
_ASCII_ODD_RX = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def is_odd(c: str) -> bool:
    """A control (not tab, LF, CR), noncharacter, private-use, unassigned or line/paragraph separator."""
    if c.isascii():
        return c in _ASCII_ODD
    return unicodedata.category(c) in ODD_CATEGORIES


def norm_char(c: str, fold_case: bool, confusables: bool = False, odd: str = " ") -> str:
    """One raw character's normalised form ("" for an invisible one), before whitespace folding;
    an odd code point (``is_odd``) becomes ``odd`` (" " or "": the two forms matched)."""
    if c.isascii():
        if c in _ASCII_ODD:
            return odd
        return c.lower() if fold_case else c
    if confusables:
        proto = TO_ASCII.get(c)     # the look-alike as written (NFKD may turn it into something else)
        if proto is not None:       # (a letter newer than this Python's Unicode data is no odd one)
            return proto.lower() if fold_case else proto
    if unicodedata.category(c) in ODD_CATEGORIES:
        return odd
    n = INVISIBLE.sub("", unicodedata.normalize("NFKD", c))
    if confusables and n:
        # before case folding: a letter's confusable class depends on its case (Greek "Ν" is an
        # "N", its lower case "ν" a "v")
        n = "".join(TO_ASCII.get(ch, ch) for ch in n)
    return n.lower() if fold_case else n


def normalize(text: str, fold_case: bool, confusables: bool = False, odd: str = " ") -> str:
    """The whole-string form (rules, prompts): the same per-character function as the output."""
    out = "".join(norm_char(c, fold_case, confusables, odd) for c in text)
    return " ".join(out.split())


def has_odd(text: str) -> bool:
    """Whether ``text`` holds an odd code point (then its removed form is matched too)."""
    if text.isascii():
        return _ASCII_ODD_RX.search(text) is not None
    return any(is_odd(c) for c in text)


def forms(text: str, fold_case: bool, confusables: bool = False) -> list[str]:
    """The normalised forms a rule is matched against: odd code points as spaces, and (when the
    text holds any) removed."""
    out = [normalize(text, fold_case, confusables)]
    if has_odd(text):
        out.append(normalize(text, fold_case, confusables, ""))
    return out


@dataclass(frozen=True)
class OutputRules:
    phrases: tuple[str, ...]           # normalised
    regexes: tuple[Any, ...]           # compiled with the `regex` module (partial matching)
    fold_case: bool
    message: str
    regex_lookback_chars: int
    fold_confusables: bool = False

    @property
    def prefixes(self) -> frozenset[str]:
        return frozenset(p[:k] for p in self.phrases for k in range(1, len(p)))


class OutputFilter:
    """Per-request state: incremental normalised text with a map back to raw positions."""

    __slots__ = ("rules", "prefixes", "firsts", "phrase_back", "keep", "text", "src", "raw_len", "checked",
                 "safe_chars", "rx_from", "odd", "saw_odd", "twin", "form_safe")

    def __init__(self, rules: OutputRules, prefixes: frozenset[str], odd: str = " ") -> None:
        self.rules = rules
        self.prefixes = prefixes
        self.odd = odd                 # what an odd code point becomes in this filter's form
        self.saw_odd = False           # the output held one: the removed form is matched too
        self.twin: OutputFilter | None = None    # that form's filter, from the first odd code point on
        self.form_safe = 0             # safe_chars of this form alone
        self.phrase_back = max((len(p) for p in rules.phrases), default=1) - 1
        # normalised chars kept behind the checked point (older text can start no new match)
        self.keep = max(self.phrase_back, rules.regex_lookback_chars if rules.regexes else 0) + 64
        self.text = ""                 # normalised output so far
        self.src: list[int] = []       # raw index of the character each normalised one came from
        self.raw_len = 0
        self.checked = 0               # normalised chars already searched for full matches
        self.safe_chars = 0            # raw chars that can never become part of a match
        self.firsts = frozenset(p[0] for p in rules.phrases)
        # per regex: no partial match can start before this normalised index (proven at an
        # earlier call; text only grows), so the partial search is O(new text + held text)
        self.rx_from = [0] * len(rules.regexes)

    def _truncate(self, raw_len: int) -> None:
        """A stop string cut the output: forget what came from the removed raw text."""
        keep = len(self.src)
        while keep and self.src[keep - 1] >= raw_len:
            keep -= 1
        del self.src[keep:]
        self.text = self.text[:keep]
        self.raw_len = raw_len
        self.checked = min(self.checked, keep)
        self.rx_from = [0] * len(self.rx_from)

    def _extend(self, text: str, start: int) -> None:
        src, fold, conf = self.src, self.rules.fold_case, self.rules.fold_confusables
        last_space = self.text.endswith(" ")
        delta = text[start:]
        if delta.isascii() and not _ASCII_SLOW.search(delta) and not (last_space and delta[0] == " "):
            # the common token: ASCII, no whitespace to fold, nothing to drop: one char per char
            self.text += delta.lower() if fold else delta
            src.extend(range(start, len(text)))
            self.raw_len = len(text)
            return
        norm: list[str] = []
        odd = self.odd
        for i in range(start, len(text)):
            c = text[i]
            if c in _ASCII_ODD or (not c.isascii() and unicodedata.category(c) in ODD_CATEGORIES
                                   and not (conf and c in TO_ASCII)):
                self.saw_odd = True
                if not odd:
                    continue            # the removed form
                c = " "
            if c.isspace():
                if not last_space:
                    norm.append(" ")
                    src.append(i)
                    last_space = True
                continue
            for ch in norm_char(c, fold, conf):
                if ch.isspace():
                    if last_space:
                        continue
                    ch = " "
                last_space = ch == " "
                norm.append(ch)
                src.append(i)
        self.text += "".join(norm)
        self.raw_len = len(text)

    def __call__(self, full_text: str) -> str | None:
        hit = self._check(full_text)
        safe = self.form_safe
        if self.saw_odd:     # odd code points: the form with them removed must be clean too
            twin = self.twin
            if twin is None:
                twin = self.twin = OutputFilter(self.rules, self.prefixes, "")
            hit = hit or twin._check(full_text)
            safe = min(safe, twin.form_safe)
        if safe > self.safe_chars:      # only ever grows (the stream reads it from another thread)
            self.safe_chars = safe
        return hit

    def _check(self, full_text: str) -> str | None:
        if len(full_text) < self.raw_len:
            self._truncate(len(full_text))
        if len(full_text) == self.raw_len:
            return None
        self._extend(full_text, self.raw_len)
        rules = self.rules
        text = self.text
        n = len(text)
        hit = None
        if rules.phrases:
            window = text[max(0, self.checked - self.phrase_back):]
            for p in rules.phrases:
                if p in window:
                    hit = f"{rules.message} (output matched a denied phrase)"
                    break
        hold = n
        if hit is None and rules.regexes:
            start = max(0, self.checked - rules.regex_lookback_chars)
            for i, rx in enumerate(rules.regexes):
                if rx.search(text, start) is not None:
                    hit = f"{rules.message} (output matched a denied pattern)"
                    break
                m = rx.search(text, max(start, self.rx_from[i]), partial=True)
                if m is not None and m.partial:
                    hold = min(hold, m.start())
                    self.rx_from[i] = m.start()
                else:
                    self.rx_from[i] = n
        self.checked = n
        if hit is not None:
            return hit
        firsts, prefixes = self.firsts, self.prefixes
        for i in range(n - min(self.phrase_back, n), n):      # longest suffix that starts a phrase
            if text[i] in firsts and text[i:] in prefixes:
                hold = min(hold, i)
                break
        safe = self.src[hold] if hold < n else self.raw_len
        if safe > self.form_safe:
            self.form_safe = safe
        if n > 4 * self.keep and hold >= n - self.keep:       # bound the window: O(delta) per call
            drop = n - self.keep
            self.text = text[drop:]
            del self.src[:drop]
            self.checked -= drop
            self.rx_from = [max(0, r - drop) for r in self.rx_from]
        return None


class Holdback:
    """The stream side of an OutputFilter: passes on only text the filter has cleared.

    Runs on the I/O loop; ``filt.safe_chars`` is written by the step thread before it hands
    the corresponding output over, and it only grows, so reading it here is race-free."""

    __slots__ = ("filt", "held", "sent_chars")

    def __init__(self, filt: OutputFilter) -> None:
        self.filt = filt
        self.held = ""          # received, not yet cleared (could start a match)
        self.sent_chars = 0

    def feed(self, text: str) -> str:
        """Add a delta; return the part that is now safe to send ("" while everything is held)."""
        held = self.held + text
        cut = min(self.filt.safe_chars - self.sent_chars, len(held))
        if cut <= 0:
            self.held = held
            return ""
        self.held = held[cut:]
        self.sent_chars += cut
        return held[:cut]

    def release(self) -> str:
        """The stream ended without a match: everything held is safe."""
        text, self.held = self.held, ""
        self.sent_chars += len(text)
        return text
