"""No request freezes the server (issue 37, item 4): a prompt that cannot fit the context is refused
from its length in characters before it is tokenized (the tokenizer's bound: the most characters
one token holds), on every route, count_tokens included; a long text is encoded without holding
the GIL; and a key's tier holds on count_tokens too."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from zgtool.engine.tokenizer import GIL_FREE_ENCODE_CHARS, HFTokenizer, max_token_chars

ROUTES = [("/v1/messages", "anthropic"), ("/v1/chat/completions", "openai"),
          ("/v1/messages/count_tokens", "anthropic")]


def _trained_byte_bpe(tmp: Path) -> Path:
    """A real byte-level BPE tokenizer.json (SmolLM2's kind), trained here on a small corpus."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(7)
    words = ["".join(rng.choice("abcdefgh ") for _ in range(rng.randint(1, 30))) for _ in range(300)]
    corpus = [" ".join(rng.choice(words) for _ in range(50)) for _ in range(200)] + ["    " * 20 + "\n" * 10]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp / "tokenizer.json"))
    return tmp


def test_no_text_has_fewer_tokens_than_its_characters_over_the_bound(tmp_path: Path) -> None:
    tok = HFTokenizer(_trained_byte_bpe(tmp_path), (0,), None)
    per = tok.max_token_chars
    assert per is not None and per > 1
    rng = random.Random(3)
    texts = ["    " * 500, "\n" * 999, "abc " * 3000, "é漢字🙂" * 100,
             *("".join(rng.choice("abcdefgh \n\t") for _ in range(rng.randint(1, 5000))) for _ in range(50))]
    for text in texts:
        assert len(tok._tok.encode(text).ids) >= -(-len(text) // per)


def test_a_long_text_gets_the_same_ids_from_the_gil_free_path(tmp_path: Path) -> None:
    tok = HFTokenizer(_trained_byte_bpe(tmp_path), (0,), None)
    text = "abc defgh " * (GIL_FREE_ENCODE_CHARS // 5)
    assert tok.encode(text) == list(tok._tok.encode(text).ids)


@pytest.mark.parametrize(("doc", "bounded"), [
    ({"normalizer": None, "pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {"ab": 0}}}, True),
    ({"normalizer": None, "pre_tokenizer": {"type": "Whitespace"},               # drops every space
      "model": {"type": "BPE", "vocab": {"ab": 0}}}, False),
    ({"normalizer": {"type": "NFKC"}, "pre_tokenizer": None,                     # may shorten the text
      "model": {"type": "BPE", "vocab": {"ab": 0}}}, False),
    ({"normalizer": None, "pre_tokenizer": None,                                  # an unk for any run
      "model": {"type": "BPE", "vocab": {"ab": 0}, "unk_token": "<unk>", "fuse_unk": True}}, False),
    ({"normalizer": None, "pre_tokenizer": {"type": "Metaspace"},
      "model": {"type": "Unigram", "vocab": [["▁ab", 0.0]], "unk_id": 0, "byte_fallback": True}}, True),
])
def test_a_bound_is_claimed_only_where_no_token_can_swallow_more(doc: dict[str, Any], bounded: bool) -> None:
    assert (max_token_chars(doc) is not None) == bounded


KEYS = """
[tiers.tiny]
requests_per_min = 2
[[keys]]
name = "tiny-user"
tier = "tiny"
key = "sk-bounds-tiny"
[[keys]]
name = "tiny-tokenizer"
tier = "tiny"
key = "sk-bounds-tiny-tok"
"""


@pytest.fixture(scope="module")
def keyed(start_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(KEYS)
    with start_server(keys=keys) as s:
        yield s


def _body(route: str, content: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "null", "messages": [{"role": "user", "content": content}]}
    if route != "/v1/messages/count_tokens":
        body["max_tokens"] = 4
    return body


@pytest.mark.parametrize(("route", "api"), ROUTES)
def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized(server: Any, route: str, api: str) -> None:
    tok = server.engine.tokenizer
    calls: list[int] = []
    template = tok.apply_chat_template
    tok.apply_chat_template = lambda *a, **kw: (calls.append(1), template(*a, **kw))[1]   # observe, then tokenize
    try:
        content = "x" * 3_000_000          # the null model: one token per byte, so at least 3,000,000 tokens
        r = httpx.post(server.url + route, json=_body(route, content), timeout=120)
    finally:
        tok.apply_chat_template = template
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "at least 3000000 tokens" in err["message"] and calls == []
    if api == "openai":
        assert err["code"] == "context_length_exceeded"
    else:
        assert err["type"] == "invalid_request_error"
    # and a prompt that fits is still tokenized and served
    ok = httpx.post(server.url + route, json=_body(route, "hello"), timeout=60)
    assert ok.status_code == 200, ok.text


def test_a_tiers_request_rate_holds_on_count_tokens(keyed: Any) -> None:
    headers = {"x-api-key": "sk-bounds-tiny"}
    codes = [httpx.post(keyed.url + "/v1/messages/count_tokens", json=_body("/v1/messages/count_tokens", "hi"),
                        headers=headers, timeout=30).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    r = httpx.post(keyed.url + "/v1/messages", json=_body("/v1/messages", "hi"), headers=headers, timeout=30)
    assert r.status_code == 429 and json.loads(r.content)["error"]["type"] == "rate_limit_error"


@pytest.mark.parametrize("form", ["prompt", "messages"])
def test_tokenize_refuses_a_prompt_that_cannot_fit_before_tokenizing_it(server: Any, form: str) -> None:
    tok = server.engine.tokenizer
    calls: list[int] = []
    encode, template = tok.encode, tok.apply_chat_template
    tok.encode = lambda *a, **kw: (calls.append(1), encode(*a, **kw))[1]
    tok.apply_chat_template = lambda *a, **kw: (calls.append(1), template(*a, **kw))[1]
    content = "x" * 3_000_000
    body = {"prompt": content} if form == "prompt" else {"messages": [{"role": "user", "content": content}]}
    try:
        r = httpx.post(server.url + "/tokenize", json=body, timeout=120)
        small = {"prompt": "hello"} if form == "prompt" else {"messages": [{"role": "user", "content": "hello"}]}
        ok = httpx.post(server.url + "/tokenize", json=small, timeout=60)
    finally:
        tok.encode, tok.apply_chat_template = encode, template
    assert r.status_code == 400, r.text
    assert "at least 3000000 tokens" in r.json()["error"]["message"] and calls == [1]   # the small one only
    assert ok.status_code == 200 and ok.json()["count"] > 0


def test_a_tiers_request_rate_holds_on_tokenize(keyed: Any) -> None:
    headers = {"x-api-key": "sk-bounds-tiny-tok"}       # its own key: the count_tokens test spends the other's
    codes = [httpx.post(keyed.url + "/tokenize", json={"prompt": "hi"}, headers=headers, timeout=30).status_code
             for _ in range(3)]
    assert codes == [200, 200, 429]
