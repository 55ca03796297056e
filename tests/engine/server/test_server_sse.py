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
