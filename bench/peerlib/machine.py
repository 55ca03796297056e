"""What machine a benchmark ran on, for its JSON: the CPU's name and the flags that decide which kernels
run. Ratios between a Python front and a C one move with the CPU (docs/profile/README.md, fourth pass),
so a figure without its CPU cannot be compared with another run's."""

from __future__ import annotations

KERNEL_FLAGS = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16",
                          "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8"})


def _cpuinfo_field(name: str) -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, sep, value = line.partition(":")
                if sep and key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or "unknown" where the kernel does not say."""
    return _cpuinfo_field("model name") or "unknown"


def cpu_flags() -> list[str]:
    """The CPU flags that decide which kernels each engine can use (/proc/cpuinfo)."""
    flags = _cpuinfo_field("flags")
    return sorted(KERNEL_FLAGS & set(flags.split())) if flags else []
