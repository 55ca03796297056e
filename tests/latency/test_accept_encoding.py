"""latency-split's client accepts what the OpenAI and Anthropic SDKs accept ("gzip, deflate", httpx's default), so a
compressing hop answers it as it answers them: nginx's gzip filter holds a stream back until its buffer fills, and
the first token's time shows it. Each read is decoded as it arrives (zgtool.latency.wire.decode); --accept-encoding
identity measures the path as curl sees it. Live: the null engine behind real nginx with gzip on."""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Iterator

import pytest
from zgtest import run_zgtool

from zgtool.gateway.supervisor import LocalStack, StackConfig
from zgtool.latency.analysis.phases import analyse
from zgtool.latency.config import SplitConfig
from zgtool.latency.records import RequestSample
from zgtool.latency.render.headline import headline
from zgtool.latency.wire import decode
from zgtool.latency.wire.decode import DecodeError, coding_of, decoded
from zgtool.targets import Target

EVENTS = [f"data: {{\"n\": {i}}}\n\n".encode() for i in range(6)]


def _flushed(comp: object, events: list[bytes]) -> list[bytes]:
    """Each event compressed and flushed on its own, as a streaming compressor that flushes per chunk sends it."""
    return [comp.compress(e) + comp.flush(zlib.Z_SYNC_FLUSH) for e in events] + [comp.flush()]  # type: ignore[attr-defined]


@pytest.mark.parametrize("coding,wbits", [("gzip", 31), ("x-gzip", 31), ("deflate", 15), ("deflate", -15)])
def test_each_compressed_read_yields_the_events_it_completed_as_it_arrives(coding: str, wbits: int) -> None:
    pieces = _flushed(zlib.compressobj(wbits=wbits), EVENTS)
    out = list(decoded(iter(pieces), coding))
    assert out[:len(EVENTS)] == EVENTS and b"".join(out) == b"".join(EVENTS)


def test_a_compressor_that_holds_everything_yields_it_at_the_end() -> None:
    comp = zlib.compressobj(wbits=31)
    held = [comp.compress(e) for e in EVENTS] + [comp.flush()]
    out = list(decoded(iter(held), "gzip"))
    assert b"".join(out[:-1]) == b"" and out[-1] == b"".join(EVENTS)


def test_identity_and_no_header_are_not_decoded_and_unknown_codings_are_refused() -> None:
    assert coding_of(None) is None and coding_of(" Identity ") is None and coding_of("GZIP") == "gzip"
    with pytest.raises(DecodeError, match="'br'"):
        list(decoded(iter([b"x"]), "br"))


def test_a_body_that_ends_early_or_is_not_compressed_is_a_decode_error() -> None:
    whole = zlib.compress(b"".join(EVENTS), wbits=31)
    with pytest.raises(DecodeError, match="ends before"):
        list(decoded(iter([whole[:-6]]), "gzip"))
    with pytest.raises(DecodeError, match="does not decode"):
        list(decoded(iter([b"data: plain text\n\n"]), "gzip"))


def test_a_body_that_inflates_past_the_bound_stops_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode, "MAX_DECODED_BYTES", 1 << 20)
    bomb = zlib.compress(bytes(8 << 20), wbits=31)       # 8 MiB of zeros in a few KB
    assert len(bomb) < 64 << 10
    with pytest.raises(DecodeError, match="past"):
        list(decoded(iter([bomb]), "gzip"))


def test_an_unknown_accept_encoding_is_a_usage_error_naming_what_decodes() -> None:
    from zgtool.errors import UsageError

    assert SplitConfig().accept_encoding == "gzip, deflate"
    SplitConfig(accept_encoding="identity")
    with pytest.raises(UsageError, match="decodes gzip, deflate, identity.*'br'"):
        SplitConfig(accept_encoding="gzip, br")


def test_the_headline_says_a_stream_arrived_in_one_piece_through_a_compressing_hop() -> None:
    rnd = random.Random(3)
    cfg = SplitConfig(num_requests=24, stream=True, resamples=300, rounds=4)
    targets = [Target(name=n, url=f"http://127.0.0.1:9/{n}/v1/messages") for n in ("direct", "nginx-gzip")]
    samples = []
    for k in range(2):
        per = []
        for i in range(24):
            total = 120.0 + rnd.uniform(-5.0, 5.0)
            held = k == 1
            per.append(RequestSample(index=i, worker=0, round=i % 4, ok=True, status=200, error=None, send_ms=0.2,
                                     ttfb_ms=total if held else 9.0, ttft_ms=total if held else 10.0 + rnd.random(),
                                     total_ms=total, itl_ms=[0.0] * 8 if held else [12.0] * 8, output_tokens=9,
                                     content_events=9, content_encoding="gzip" if held else None))
        samples.append(per)
    line = headline(analyse(targets, samples, cfg))
    assert "nginx-gzip" in line and "its first token +" in line and "significant" in line
    assert "the stream arrived in one piece: a hop held it back, compressing it" in line


@pytest.fixture(scope="module")
def gzip_nginx() -> Iterator[LocalStack]:
    # zgtool's nginx "buffered" path: proxy_buffering on and gzip on for text/event-stream
    with LocalStack(StackConfig(model="null", paths=("nginx-buffered",))) as st:
        yield st


def _split(*args: str, stream: str = "--stream") -> dict:
    proc = run_zgtool("latency-split", *args, stream, "-n", "8", "--warmup", "1", "--json", timeout_s=180)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["data"]


def test_through_nginx_with_gzip_the_answers_come_compressed_and_are_read_whole(gzip_nginx: LocalStack) -> None:
    direct, via = gzip_nginx.urls["direct"], gzip_nginx.urls["nginx-buffered"]
    data = _split(direct, via)
    d, v = data["targets"]
    assert all(s["content_encoding"] is None for s in d["samples"])
    assert v["num_ok"] == 8 and all(s["content_encoding"] == "gzip" for s in v["samples"])
    assert all(s["output_tokens"] and s["content_events"] == s["output_tokens"] for s in v["samples"])
    assert any("8 of 8 answers came compressed (gzip x8)" in n for n in data["attribution_notes"])
    assert data["config"]["accept_encoding"] == "gzip, deflate"
    plain = _split(via, "--accept-encoding", "identity")
    assert all(s["ok"] and s["content_encoding"] is None for s in plain["targets"][0]["samples"])
    assert not any("came compressed" in n for n in plain["attribution_notes"])
    assert plain["config"]["accept_encoding"] == "identity"


def test_a_whole_json_answer_through_nginx_with_gzip_is_decoded_too(gzip_nginx: LocalStack) -> None:
    data = _split(gzip_nginx.urls["nginx-buffered"], stream="--no-stream")
    (t,) = data["targets"]
    assert t["num_ok"] == 8 and all(s["content_encoding"] == "gzip" and s["output_tokens"] for s in t["samples"])
    assert any("8 of 8 answers came compressed (gzip x8), as every client" in n and "holds a stream" not in n
               for n in data["attribution_notes"])
