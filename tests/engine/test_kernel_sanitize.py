"""Under scripts/sanitize_kernels.sh (ZGTOOL_KERNEL_SANITIZE=address|thread) the kernels the other
tests call are the instrumented build, so a clean run means the sanitizer saw them."""

from __future__ import annotations

import os

import pytest

from zgtool.engine import cpu_kernels as ck

pytestmark = [pytest.mark.sanitize,
              pytest.mark.skipif(not ck.cpu_has_avx2_fma(), reason="the kernels need AVX2 + FMA")]


def test_the_loaded_library_is_the_instrumented_build() -> None:
    want = os.environ["ZGTOOL_KERNEL_SANITIZE"]
    flags = ck.build_flags()
    assert any(f.startswith("-fsanitize=") and want[:6] in f for f in flags), flags
    lib = ck.library()
    built = ck.cache_dir() / f"zg_kernels-{ck.build_key(flags)}"
    assert lib._name == str(built / ck.LIB_NAME)
    assert "-fsanitize=" in (built / "build.log").read_text().splitlines()[0]
