"""`zgtool bench --k8s N`: the same scenario as a k6-operator TestRun with `parallelism: N`.

k6-operator gives each of the N runner pods an equal execution segment (what `--segment i/N` does
on one machine). Written: a ConfigMap with zgtool's k6 script and request body (mounted in /test
in every pod), a Secret with the request headers (API keys never appear in the TestRun), and the
TestRun itself. Apply with `kubectl apply -f DIR`. JSON strings are YAML scalars, so every value
is written with json.dumps: no YAML library is needed and no value can break the document.
"""

from __future__ import annotations

import json
from pathlib import Path

from zgtool.errors import UsageError

API_VERSION = "k6.io/v1alpha1"  # grafana/k6-operator's TestRun CRD
SCRIPT_KEY = "gateway_vs_direct.js"
PAYLOAD_KEY = "payload.json"
SECRET_KEYS = ("DIRECT_HEADERS", "GATEWAY_HEADERS")


def _q(value: str) -> str:
    return json.dumps(value)


def manifests(*, name: str, parallelism: int, script: str, payload: str, env: dict[str, str]) -> dict[str, str]:
    """File name -> YAML text for the ConfigMap, the Secret and the TestRun."""
    if parallelism < 1:
        raise UsageError(f"--k8s N needs N >= 1 runner pods, not {parallelism}")
    cm, secret = f"{name}-script", f"{name}-headers"
    configmap = "\n".join([
        "apiVersion: v1", "kind: ConfigMap", "metadata:", f"  name: {_q(cm)}", "data:",
        f"  {SCRIPT_KEY}: {_q(script)}", f"  {PAYLOAD_KEY}: {_q(payload)}", ""])
    secret_doc = "\n".join([
        "apiVersion: v1", "kind: Secret", "metadata:", f"  name: {_q(secret)}", "type: Opaque", "stringData:",
        *(f"  {k}: {_q(env.get(k, '{}'))}" for k in SECRET_KEYS), ""])
    plain = {k: v for k, v in env.items() if k not in SECRET_KEYS}
    plain["PAYLOAD"] = PAYLOAD_KEY          # next to the script in /test
    plain["SUMMARY"] = "/tmp/summary.json"  # inside each pod; read it from the pod's logs or volume
    env_lines = [line for k, v in sorted(plain.items()) for line in (f"      - name: {_q(k)}", f"        value: {_q(v)}")]
    env_lines += [line for k in SECRET_KEYS for line in (
        f"      - name: {_q(k)}", "        valueFrom:", "          secretKeyRef:",
        f"            name: {_q(secret)}", f"            key: {_q(k)}")]
    testrun = "\n".join([
        f"apiVersion: {API_VERSION}", "kind: TestRun", "metadata:", f"  name: {_q(name)}", "spec:",
        f"  parallelism: {parallelism}", "  script:", "    configMap:", f"      name: {_q(cm)}",
        f"      file: {_q(SCRIPT_KEY)}",
        # every runner keeps its raw points: copy them out and `zgtool bench merge` them as segments
        f"  arguments: {_q('--out csv=/tmp/points.csv.gz')}",
        "  runner:", "    env:", *env_lines, ""])
    return {"k6-configmap.yaml": configmap, "k6-secret.yaml": secret_doc, "k6-testrun.yaml": testrun}


def write_manifests(out_dir: Path, files: dict[str, str]) -> list[Path]:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = []
        for fname, text in files.items():
            p = out_dir / fname
            p.write_text(text)
            paths.append(p)
    except OSError as exc:
        raise UsageError(f"cannot write the k8s manifests to {out_dir}: {exc}") from exc
    return paths
