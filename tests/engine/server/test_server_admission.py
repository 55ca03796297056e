"""Admission: keys, tiers, sliding windows, retry-after and load-aware caps (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zgtool.engine.server.admission import Admission
from zgtool.engine.server.errors import HttpError
from zgtool.http.errors import ConfigError
from zgtool.http.keys import load_keys

KEYS = """
[tiers.t]
max_concurrent = 4
requests_per_min = 3
tokens_per_min = 100
[[keys]]
name = "alice"
tier = "t"
key = "sk-alice"
[[keys]]
name = "bob"
tier = "t"
sha256 = "{bob}"
[tiers.c]
max_concurrent = 2
[[keys]]
name = "carol"
tier = "c"
key = "sk-carol"
[admin]
keys = ["sk-admin"]
"""
IDLE = {"kv_util": 0.0, "running": 0, "waiting": 0}


@pytest.fixture()
def adm(tmp_path: Path) -> Admission:
    import hashlib

    p = tmp_path / "keys.toml"
    p.write_text(KEYS.replace("{bob}", hashlib.sha256(b"sk-bob").hexdigest()))
    return Admission(load_keys(p))


def test_keys_are_read_from_x_api_key_or_bearer_including_sha256_entries(adm: Admission) -> None:
    assert adm.authenticate({b"x-api-key": b"sk-alice"}).name == "alice"
    assert adm.authenticate({b"authorization": b"Bearer sk-bob"}).name == "bob"
    admin = adm.authenticate({b"x-api-key": b"sk-admin"})
    assert admin.is_admin and admin.tier is None


@pytest.mark.parametrize("headers", [{}, {b"x-api-key": b"sk-wrong"}, {b"authorization": b"Basic abc"}])
def test_missing_or_unknown_key_is_401_authentication_error(adm: Admission, headers: dict) -> None:
    with pytest.raises(HttpError) as ei:
        adm.authenticate(headers)
    assert (ei.value.status, ei.value.error_type) == (401, "authentication_error")
    assert b"sk-wrong" not in str(ei.value).encode()


def test_no_keys_file_means_open_admission() -> None:
    adm = Admission(None)
    p = adm.authenticate({})
    for _ in range(100):
        adm.admit(p, 10_000, IDLE, 0.0)
    assert adm.open


def test_requests_per_minute_limit_gives_429_with_retry_after_until_window_end(adm: Admission) -> None:
    p = adm.authenticate({b"x-api-key": b"sk-alice"})
    for i in range(3):
        adm.admit(p, 1, IDLE, 10.0 + i)
        adm.release(p, 0, 0.1, 10.0 + i)
    with pytest.raises(HttpError) as ei:
        adm.admit(p, 1, IDLE, 20.0)
    err = ei.value
    assert (err.status, err.error_type) == (429, "rate_limit_error")
    headers = dict(err.headers)
    assert headers[b"retry-after"] == b"50"      # the first request leaves the window at t=70
    assert headers[b"anthropic-ratelimit-requests-remaining"] == b"0"
    adm.admit(p, 1, IDLE, 70.5)                  # window slid: admitted again


def test_tokens_per_minute_counts_prompt_and_output_tokens(adm: Admission) -> None:
    p = adm.authenticate({b"x-api-key": b"sk-alice"})
    adm.admit(p, 60, IDLE, 0.0)
    adm.release(p, 30, 0.1, 1.0)
    with pytest.raises(HttpError, match="tokens per minute"):
        adm.admit(p, 20, IDLE, 2.0)


def test_concurrency_cap_retry_after_grows_with_the_queue(adm: Admission) -> None:
    adm.ema_e2e_s = 2.0
    p = adm.authenticate({b"x-api-key": b"sk-carol"})
    adm.admit(p, 1, IDLE, 0.0)
    adm.admit(p, 1, IDLE, 0.0)
    with pytest.raises(HttpError) as ei:
        adm.admit(p, 1, {"kv_util": 0.5, "running": 2, "waiting": 6}, 0.0)
    assert "concurrency limit of 2" in ei.value.message
    assert dict(ei.value.headers)[b"retry-after"] == b"8"   # 2 s x (1 + 6/2)
    adm.release(p, 0, 2.0, 1.0)
    adm.admit(p, 1, IDLE, 1.0)                               # a slot freed: admitted


def test_caps_halve_only_after_load_stays_high_and_recover_after_it_stays_low(adm: Admission) -> None:
    tier = adm.keys.tiers["t"]  # type: ignore[union-attr]
    hot = {"kv_util": 0.95}
    adm.update_load(hot, 0.0)
    adm.update_load(hot, 0.5)
    assert adm.concurrency_cap(tier) == 4         # a spike shorter than hold_s changes nothing
    adm.update_load(hot, 1.1)
    assert adm.cap_factor == 0.5 and adm.concurrency_cap(tier) == 2
    adm.update_load({"kv_util": 0.2}, 2.0)
    adm.update_load({"kv_util": 0.2}, 3.1)
    assert adm.concurrency_cap(tier) == 4


def test_gpu_sm_util_percent_also_counts_as_load(adm: Admission) -> None:
    adm.update_load({"kv_util": 0.1, "sm_util": 97.0}, 0.0)
    adm.update_load({"kv_util": 0.1, "sm_util": 97.0}, 1.5)
    assert adm.cap_factor == 0.5


@pytest.mark.parametrize(("text", "msg"), [
    ("[[keys]]\nname='a'\ntier='nope'\nkey='k'", "tier 'nope', which is not defined"),
    ("[tiers.t]\nmax_concurrent=-1", "max_concurrent must be an integer >= 0"),
    ("[tiers.t]\nrpm=3", "unknown fields"),
    ("[tiers.t]\n[[keys]]\ntier='t'", "needs key"),
    ("not toml = = =", "invalid TOML"),
    ("[tiers.t]", "defines no"),
])
def test_bad_keys_files_are_one_line_config_errors(tmp_path: Path, text: str, msg: str) -> None:
    p = tmp_path / "k.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=msg):
        load_keys(p)


def test_missing_keys_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_keys(tmp_path / "absent.toml")
