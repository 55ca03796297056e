"""k6 execution segments: one scenario split across N load generators by k6 itself.

`zgtool bench --segment i/N` runs the i-th of N equal slices (k6 `--execution-segment` and
`--execution-segment-sequence`, what k6-operator's `parallelism: N` passes to each runner pod):
the arrival rate and VUs are divided by k6, not by zgtool. Each segment keeps its raw points
(k6 `--out csv`), so `zgtool bench merge` recomputes the trends from every request, never by
averaging percentiles.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from zgtool.errors import UsageError


def _frac(k: int, n: int) -> str:
    return "0" if k == 0 else "1" if k == n else f"{k}/{n}"


@dataclass(frozen=True)
class Segment:
    index: int   # 1-based
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 1 <= self.index <= self.count:
            raise UsageError(f"--segment must be i/N with 1 <= i <= N, not {self.index}/{self.count}")

    @classmethod
    def parse(cls, text: str) -> Segment:
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if not m:
            raise UsageError(f"--segment: expected i/N such as 1/3 (the first of three), not {text!r}")
        return cls(int(m.group(1)), int(m.group(2)))

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def k6_segment(self) -> str:
        return f"{_frac(self.index - 1, self.count)}:{_frac(self.index, self.count)}"

    @property
    def k6_sequence(self) -> str:
        return ",".join(_frac(k, self.count) for k in range(self.count + 1))

    def k6_args(self) -> list[str]:
        return ["--execution-segment", self.k6_segment, "--execution-segment-sequence", self.k6_sequence]
