#!/usr/bin/env bash
# One command that proves or disproves zgtool's CUDA path on a GPU machine (issues 13, 35):
# sets zgtool up (as the README does: a venv, the installed torch kept, `pip install -e .`),
# runs the GPU tests (tests/gpu and the Triton kernels compiled for real), bench/gpu_roofline.py
# (llama-1b and llama-8b against the HBM roofline, the compiled transformers peer, cold TTFT), then
# scripts/gateway_tax.sh (zgtool serve on the GPU, latency-split direct vs nginx vs pygw), and
# writes everything to one JSON file (gpu_check.json) plus a log (gpu_check.log). About 6-8
# minutes on one GPU, no network needed. Its status is "passed" only when every target was met
# too; "target_missed" when everything ran and a target was not met (each listed); else "failed".
#
#   bash scripts/gpu_check.sh --prepare      # on a machine WITH network: wheels for the GPU
#                                            # machine's Python (ZG_GPU_PY, default 3.12) into .whl/,
#                                            # checked to travel with the tree within 64 MiB
#   bash scripts/gpu_check.sh [OUT_DIR]      # on the GPU machine (OUT_DIR default: $OUT, else
#                                            # reports/gpu-check-<time>)
#
# The GPU machine needs python3 with a CUDA build of torch (and transformers for the parity
# tests); the venv is made with --system-site-packages so that torch is used as it is, the way
# scripts/setup.sh keeps an installed torch. Without network, the packages zgtool needs besides
# come from .whl/ (made by --prepare). Exit: 0 all passed, 1 a test failed or the bench broke,
# 4 no CUDA device.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WHEELS=$ROOT/.whl
# what zgtool needs beyond a CUDA image's usual packages (torch, transformers, numpy, httpx...);
# pip skips whatever is already installed at a satisfying version
EXTRA_PKGS=("uvicorn>=0.30,<0.56" "httpcore>=1.0,<1.1" "orjson>=3.9" "jinja2>=3.1" "httptools>=0.6" "regex>=2023.0" "cryptography>=42" "scapy>=2.5" "redis>=5"
            "anthropic>=0.40" "openai>=1.40" "gguf>=0.10" "typer>=0.29,<0.30" "pytest-timeout>=2"
            "nvidia-ml-py>=12" "prometheus-client>=0.20" "safetensors>=0.4")

if [ "${1:-}" = "--prepare" ]; then
  pyver=${ZG_GPU_PY:-3.12}
  mkdir -p "$WHEELS"
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  plats=()
  for p in manylinux_2_39_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 \
           manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 any; do
    plats+=(--platform "$p")
  done
  python3 -m pip download -q --only-binary=:all: --python-version "$pyver" --implementation cp \
    "${plats[@]}" -d "$WHEELS" "${EXTRA_PKGS[@]}" || exit 1
  # what travels: the tracked and untracked-but-not-ignored files, plus .whl (64 MiB in all)
  tree_b=$(git ls-files -co --exclude-standard -z | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
  whl_b=$(du -sb "$WHEELS" | cut -f1)
  budget_b=$(( ${ZG_CARRY_MIB:-64} * 1024 * 1024 ))
  echo "gpu_check: $(ls "$WHEELS" | wc -l) wheels ($(( whl_b / 1048576 )) MiB) in .whl/ for Python $pyver;" \
       "with the tree ($(( tree_b / 1048576 )) MiB): $(( (tree_b + whl_b) / 1048576 )) of ${ZG_CARRY_MIB:-64} MiB"
  if [ $(( tree_b + whl_b )) -gt $budget_b ]; then
    echo "gpu_check: the bundle exceeds ${ZG_CARRY_MIB:-64} MiB: the device machine cannot receive it" >&2
    exit 1
  fi
  echo "gpu_check: carry .whl to the GPU machine"
  exit 0
fi

OUT_DIR=${1:-${OUT:-reports/gpu-check-$(date -u +%Y%m%d-%H%M%S)}}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
LOG=$OUT_DIR/gpu_check.log
exec > >(tee -a "$LOG") 2>&1
export PYTHONUNBUFFERED=1
t_start=$(date +%s)
PY=${PYTHON:-python3}
echo "gpu_check: $(date -u +%FT%TZ) in $ROOT -> $OUT_DIR"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv,noheader 2>&1 || true

write_json() {  # status reason: the summary when no test could run
  "$PY" - "$OUT_DIR/gpu_check.json" "$1" "$2" <<'EOF'
import json, sys
json.dump({"schema": "zgtool.gpu_check/1", "ok": False, "status": sys.argv[2], "reason": sys.argv[3]},
          open(sys.argv[1], "w"), indent=2)
EOF
}

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: not run: no CUDA device visible to $PY's torch"
  write_json no_cuda "no CUDA device visible to torch"
  exit 4
fi

# --- setup: the README's way, offline-capable -------------------------------------------
VENV=$ROOT/.venv-gpu
[ -x "$VENV/bin/python" ] || "$PY" -m venv --system-site-packages "$VENV" || { write_json setup_failed "venv"; exit 1; }
# a python3 that is itself a venv (the CUDA image's /opt/torch/.venv): --system-site-packages reaches
# only the base interpreter's packages, so the new venv also gets the parent venv's site-packages
"$PY" -c 'import site, sys; print("\n".join(site.getsitepackages()) if sys.prefix != sys.base_prefix else "")' \
  > "$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')/zg_parent_site.pth"
pip_src=()
if [ -d "$WHEELS" ]; then pip_src=(--no-index --find-links "$WHEELS"); fi
t0=$(date +%s)
if ! "$VENV/bin/python" -m pip install -q --no-build-isolation "${pip_src[@]}" -e . "${EXTRA_PKGS[@]}"; then
  echo "gpu_check: setup failed (without network, run 'bash scripts/gpu_check.sh --prepare' where there is one and carry .whl)"
  write_json setup_failed "pip install -e . failed; see gpu_check.log"
  exit 1
fi
setup_s=$(( $(date +%s) - t0 ))
echo "gpu_check: setup ${setup_s}s: $("$VENV/bin/python" -c 'import torch;print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))')"

# --- the GPU tests ----------------------------------------------------------------------
t0=$(date +%s)
# tests/gpu (the gpu-marked ones need CUDA) and the Triton kernels compiled for the device (on CPU
# they run in the interpreter)
timeout 180 "$VENV/bin/python" -m pytest tests/gpu tests/engine/test_triton_kernels.py -q -p no:cacheprovider -rA \
  --junitxml="$OUT_DIR/pytest_gpu.xml" --timeout=150
pytest_rc=$?
pytest_s=$(( $(date +%s) - t0 ))

# --- the roofline benchmark -------------------------------------------------------------
t0=$(date +%s)
timeout 270 "$VENV/bin/python" bench/gpu_roofline.py --steps 48 --hf-tokens 32 | tee "$OUT_DIR/gpu_roofline.txt"
bench_rc=${PIPESTATUS[0]}
bench_s=$(( $(date +%s) - t0 ))

# --- the thesis: the gateway tax in front of the GPU engine ---------------------------------
t0=$(date +%s)
PYTHON="$VENV/bin/python" timeout 150 bash scripts/gateway_tax.sh "$OUT_DIR/gateway_tax" dummy:llama-1b cuda 32
tax_rc=$?
tax_s=$(( $(date +%s) - t0 ))

"$VENV/bin/python" scripts/gpu_check_summary.py "$OUT_DIR" "$pytest_rc" "$bench_rc" "$setup_s" "$pytest_s" "$bench_s" \
  "$t_start" "$tax_rc" "$tax_s"
