#!/usr/bin/env bash
# The thesis on one host (issue 35, part 5): `zgtool serve` on this machine's device, then
# `zgtool latency-split` direct vs nginx vs pygw (stream, c=1 and c=16, one run), and the
# gateway tax in ms and as a share of the engine's own per-token time (gateway_tax.json).
#
#   bash scripts/gateway_tax.sh OUT_DIR [MODEL] [DEVICE] [REQUESTS]
#        (defaults: dummy:llama-1b cuda 40; scripts/gpu_check.sh calls it on the GPU machine)
#
# Every process it starts is stopped on exit (its own session each). Exit: 0 measured, 1 a stage
# failed (named in gateway_tax.log), 4 nginx is missing (pygw alone is then measured, exit 0).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: gateway_tax.sh OUT_DIR [MODEL] [DEVICE] [REQUESTS]}
MODEL=${2:-dummy:llama-1b}
DEVICE=${3:-cuda}
N=${4:-40}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$p" 2>/dev/null
  done
}
trap cleanup EXIT
port() { "$PY" -c 'from zgtool.http.net import free_port; print(free_port())'; }
wait_up() {  # url pid seconds: until GET url answers 200, the process dies, or the time runs out
  "$PY" - "$1" "$2" "$3" <<'EOF'
import os, sys, time, httpx
url, pid, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + limit
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(f"process {pid} exited before {url} answered")
    try:
        if httpx.get(url, timeout=2).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(0.2)
sys.exit(f"{url} did not answer within {limit:.0f} s")
EOF
}

engine_port=$(port)
setsid "$PY" -m zgtool serve --model "$MODEL" --device "$DEVICE" --port "$engine_port" --max-num-seqs 32 \
  > "$OUT/serve.log" 2>&1 &
pids+=($!)
wait_up "http://127.0.0.1:$engine_port/health" "${pids[-1]}" 300 || { tail -5 "$OUT/serve.log"; exit 1; }
targets=("http://127.0.0.1:$engine_port")
names=(direct)
pygw_port=$(port)
setsid "$PY" -m zgtool gateway --kind pygw --upstream "http://127.0.0.1:$engine_port" --port "$pygw_port" \
  --policy none --run-dir "$OUT/pygw" > "$OUT/pygw.log" 2>&1 &
pids+=($!)
wait_up "http://127.0.0.1:$pygw_port/v1/models" "${pids[-1]}" 60 || { tail -5 "$OUT/pygw.log"; exit 1; }
rc_nginx=0
if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then
  nginx_port=$(port)
  setsid "$PY" -m zgtool gateway --kind nginx --upstream "http://127.0.0.1:$engine_port" --port "$nginx_port" \
    --run-dir "$OUT/nginx" > "$OUT/nginx.log" 2>&1 &
  pids+=($!)
  wait_up "http://127.0.0.1:$nginx_port/v1/models" "${pids[-1]}" 60 || { tail -5 "$OUT/nginx.log"; exit 1; }
  targets+=("http://127.0.0.1:$nginx_port"); names+=(nginx)
else
  echo "gateway_tax: nginx not installed: pygw only"; rc_nginx=4
fi
targets+=("http://127.0.0.1:$pygw_port"); names+=(pygw)
echo "gateway_tax: ${names[*]} -> ${targets[*]} (model $MODEL on $DEVICE, $N requests, stream, c=1,16)"
"$PY" -m zgtool latency-split "${targets[@]}" -n "$N" -c 1,16 --stream --max-tokens 64 --quiet \
  -o "$OUT/latency_split.json" > "$OUT/latency_split.txt" 2>&1 || { tail -20 "$OUT/latency_split.txt"; exit 1; }
"$PY" bench/gateway_tax_summary.py "$OUT/latency_split.json" "${names[@]}" > "$OUT/gateway_tax.txt" || exit 1
cat "$OUT/gateway_tax.txt"
tail -1 "$OUT/gateway_tax.txt" > "$OUT/gateway_tax.json"
[ $rc_nginx -eq 4 ] && echo "gateway_tax: (no nginx row)"
exit 0
