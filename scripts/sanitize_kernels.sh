#!/usr/bin/env bash
# Opt-in sanitizer run of the C kernels (engine/csrc/): an ASan+UBSan build under the kernel tests,
# then a TSan build under the thread-pool tests. The instrumented builds are their own cache
# entries (ZGTOOL_KERNEL_SANITIZE=address|thread adds the flags); Python itself is not
# instrumented, so the sanitizer runtime is preloaded. Any report fails the run (halt_on_error).
# Usage: bash scripts/sanitize_kernels.sh [address|thread]   (both by default)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CC=${CC:-gcc}
which=${1:-all}
rc=0

kernel_tests=(tests/engine/test_kernel_sanitize.py tests/engine/test_kernel_abi.py tests/engine/test_kernel_arguments.py
              tests/engine/test_kernel_pool.py tests/engine/test_kernel_pool_starts.py tests/engine/test_cpu_attention_kernel.py
              tests/engine/test_cpu_prefill_kernels.py)
pool_tests=(tests/engine/test_kernel_sanitize.py tests/engine/test_kernel_pool.py tests/engine/test_kernel_pool_starts.py)

if [[ $which == all || $which == address ]]; then
  echo "== ASan + UBSan: kernel tests"
  ZGTOOL_KERNEL_SANITIZE=address \
  LD_PRELOAD="$($CC -print-file-name=libasan.so) $($CC -print-file-name=libubsan.so)" \
  ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$PY" -m pytest -q -p no:cacheprovider "${kernel_tests[@]}" || rc=1
fi
if [[ $which == all || $which == thread ]]; then
  echo "== TSan: thread-pool tests"
  # TSan maps its shadow at fixed addresses: high mmap randomisation (vm.mmap_rnd_bits > 28 on new
  # kernels) breaks it, so the run disables ASLR for the process where setarch allows
  launcher=()
  if setarch "$(uname -m)" -R true 2>/dev/null; then launcher=(setarch "$(uname -m)" -R); fi
  ZGTOOL_KERNEL_SANITIZE=thread \
  LD_PRELOAD="$($CC -print-file-name=libtsan.so)" \
  TSAN_OPTIONS=halt_on_error=1:report_signal_unsafe=0:ignore_noninstrumented_modules=1 \
    "${launcher[@]}" "$PY" -m pytest -q -p no:cacheprovider "${pool_tests[@]}" || rc=1
fi
exit $rc
