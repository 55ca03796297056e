"""Token grouping for --stream-interval."""

from zgtool.engine.server.sse import TokenGrouper


def test_first_token_is_sent_alone_then_groups_of_interval() -> None:
    g = TokenGrouper(3)
    emitted = [g.add(t, 1) for t in "abcdefg"]
    assert emitted == ["a", None, None, "bcd", None, None, "efg"]
    assert g.flush() is None


def test_interval_one_emits_every_delta_and_skips_empty_text() -> None:
    g = TokenGrouper(1)
    assert [g.add(t, 1) for t in ["x", "", "y"]] == ["x", None, "y"]


def test_flush_returns_the_remainder() -> None:
    g = TokenGrouper(4)
    g.add("a", 1)
    g.add("b", 1)
    assert g.flush() == "b"


class _ListGrouper:
    """The grouping rule written plainly (parts always in a list): the reference the grouper's
    one-part shortcut must match."""

    def __init__(self, interval: int) -> None:
        self.interval, self.parts, self.tokens, self.sent_first = max(1, interval), [], 0, False

    def add(self, text: str, num_tokens: int) -> str | None:
        if text:
            self.parts.append(text)
        self.tokens += num_tokens
        if not self.parts or (self.sent_first and self.tokens < self.interval):
            return None
        out, self.parts, self.tokens, self.sent_first = "".join(self.parts), [], 0, True
        return out


def test_the_grouper_emits_what_the_plain_rule_emits_over_random_deltas() -> None:
    import random

    rng = random.Random(34)
    for interval in (1, 2, 3, 5):
        ours, ref = TokenGrouper(interval), _ListGrouper(interval)
        for _ in range(2000):
            text = rng.choice(["", "", "a", "bc", "\u00e9", "x y"])
            n = rng.choice([0, 1, 1, 1, 2])
            assert ours.add(text, n) == ref.add(text, n)
        assert ours.flush() == ("".join(ref.parts) or None)
