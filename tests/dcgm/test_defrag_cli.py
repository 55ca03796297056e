"""`zgtool defrag` against a tiny loopback engine-admin server (docs/CONTRACTS.md shape).

The end-to-end defrag tests against the real engine belong to the engine side."""

from __future__ import annotations

import json

from dcgm_helpers import run_cli

from zgtool.errors import ExitCode

KEY = {"ZGTOOL_ADMIN_KEY": "adm-secret"}


def test_defrag_prints_before_after_and_the_actions_taken(admin_engine):
    served, _ = admin_engine
    proc = run_cli("defrag", "--engine", served.url, "--drop-prefix-cache", env=KEY)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "before / after defrag" in out
    assert "fragmentation" in out and "0.444" in out and "0.000" in out
    assert "compacted 10 live blocks" in out and "dropped 4 evictable prefix-cache blocks" in out
    post = [r for r in served.requests if r["method"] == "POST"]
    assert post == [{"method": "POST", "path": "/admin/defrag",
                     "body": {"dry_run": False, "drop_prefix_cache": True}}]


def test_dry_run_json_result_changes_nothing(admin_engine):
    served, behaviour = admin_engine
    kv_before = dict(behaviour.kv)
    proc = run_cli("defrag", "--engine", served.url, "--dry-run", "--json", "--admin-key", "adm-secret")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["kind"] == "defrag" and result["schema"] == "zgtool.result/1"
    d = result["data"]
    assert d["dry_run"] is True and d["actions"] == []
    assert d["before"] == d["after"] == kv_before
    assert behaviour.kv == kv_before
    assert "adm-secret" not in proc.stdout  # the key never lands in a result


def test_wrong_admin_key_gives_a_clear_message_and_exit_2(admin_engine):
    served, _ = admin_engine
    proc = run_cli("defrag", "--engine", served.url, "--admin-key", "nope")
    assert proc.returncode == ExitCode.USAGE
    assert "refused the admin key (HTTP 401: invalid x-api-key)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not [r for r in served.requests if r["method"] == "POST"]  # nothing attempted


def test_missing_admin_key_says_how_to_pass_one(admin_engine):
    served, _ = admin_engine
    proc = run_cli("defrag", "--engine", served.url, env={"ZGTOOL_ADMIN_KEY": ""})
    assert proc.returncode == ExitCode.USAGE
    assert "requires an admin key" in proc.stderr and "ZGTOOL_ADMIN_KEY" in proc.stderr


def test_unreachable_engine_exits_3(free_port):
    proc = run_cli("defrag", "--engine", f"http://127.0.0.1:{free_port}", env=KEY)
    assert proc.returncode == ExitCode.UNREACHABLE
    assert "cannot reach the engine" in proc.stderr and "Traceback" not in proc.stderr


def test_server_without_admin_endpoints_exits_4(exporter):
    proc = run_cli("defrag", "--engine", exporter.url, env=KEY)
    assert proc.returncode == ExitCode.MISSING_CAPABILITY
    assert "no zgtool admin endpoints" in proc.stderr


def test_malformed_engine_url_exits_2():
    proc = run_cli("defrag", "--engine", "http://:99999")
    assert proc.returncode == ExitCode.USAGE and "malformed URL" in proc.stderr
