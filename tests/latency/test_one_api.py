"""Every path of a run is measured on one API (zgtool.latency.wire.same_model.one_api): detection takes, per path,
the API on which the engine's timing shows, so zgtool's engine direct went on Anthropic's Messages while LiteLLM in
front of it went on chat/completions (it passes the engine's timing on only there), and the tax then counted
LiteLLM and the engine's other front alike. Now both take the API every path answers, the one with the most
timed answers. The live case: tests/gateway/test_litellm_detection.py."""

from __future__ import annotations

from zgtool.latency.wire.detect import Detection
from zgtool.latency.wire.same_model import one_api
from zgtool.targets import Target


def _path(name: str, api: str, answers: tuple[tuple[str, bool], ...]) -> tuple[Target, Detection]:
    return Target(name, f"http://127.0.0.1:{len(name)}", api, "m"), Detection(api, "m", "asked", True, (), None,
                                                                              answers)


def test_paths_on_different_apis_take_the_one_every_path_answers_with_the_most_timing() -> None:
    direct = _path("direct", "anthropic", (("anthropic", True), ("openai", True)))
    litellm = _path("litellm", "openai", (("anthropic", False), ("openai", True)))
    (t1, f1), (t2, f2) = one_api([direct, litellm], [False, False])
    assert t1.api == t2.api == "openai" and f1 is not None and f1.api == "openai"
    assert f1.how == ("asked; measured on the openai API, which every path answers (2 of 2 with the engine's "
                      "timing), so that every path sends the same request")
    assert f2 is not None and f2.how == "asked"           # already there: unchanged


def test_a_tie_keeps_the_first_paths_api_and_no_common_api_changes_nothing() -> None:
    a = _path("a", "anthropic", (("anthropic", False), ("openai", False)))
    b = _path("b", "openai", (("anthropic", False), ("openai", False)))
    assert [t.api for t, _ in one_api([a, b], [False, False])] == ["anthropic", "anthropic"]
    only_chat = _path("c", "openai", (("openai", True),))
    only_messages = _path("d", "anthropic", (("anthropic", True),))
    assert one_api([only_messages, only_chat], [False, False]) == [only_messages, only_chat]


def test_a_config_entrys_api_is_kept_and_an_undetected_url_constrains_nothing() -> None:
    entry = (Target("entry", "http://127.0.0.1:1", "anthropic", "m"), None)
    bare = _path("bare", "openai", (("anthropic", False), ("openai", True)))
    (t1, _), (t2, _) = one_api([entry, bare], [True, False])
    assert t1.api == t2.api == "anthropic"
    dead = (Target("dead", "http://127.0.0.1:2", "anthropic", "m"), None)
    assert [t.api for t, _ in one_api([bare, dead], [False, False])] == ["openai", "anthropic"]
