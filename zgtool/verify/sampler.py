"""Engine (and GPU, where NVML finds one) timeline sampled in a background thread during a run.

Uses zgtool.dcgm's sources and WatchState, so the result is an ordinary "dcgm.watch" result;
verify adds `stages` ([{name, start_s, end_s}] on the same clock) so the report can band them.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from zgtool.errors import MissingCapability, ZgError


class Sampler:
    def __init__(self, engine_url: str, interval_s: float) -> None:
        from zgtool.dcgm.sources import EngineSource, NvmlSource
        from zgtool.dcgm.watch import WatchConfig

        self.interval_s = interval_s
        self.config = WatchConfig(interval_s=interval_s)
        self.sources: dict[str, Any] = {"engine": EngineSource(engine_url)}
        self.gpu_note: str | None = None
        try:
            self.sources["nvml"] = NvmlSource()
        except MissingCapability as exc:
            self.gpu_note = f"no GPU metrics: {exc.message}"
        except Exception as exc:  # a broken driver install must not end the run
            self.gpu_note = f"no GPU metrics: NVML failed ({type(exc).__name__}: {exc})"
        self.states: dict[str, Any] = {}
        self.stages: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = time.monotonic()

    def now_s(self) -> float:
        return time.monotonic() - self.t0

    def mark(self, name: str, start_s: float, end_s: float) -> None:
        self.stages.append({"name": name, "start_s": round(start_s, 3), "end_s": round(end_s, 3)})

    def start(self) -> None:
        from zgtool.dcgm.rules import RuleEvaluator
        from zgtool.dcgm.watch import WatchState

        for name, src in self.sources.items():
            self.states[name] = WatchState(src.describe(), self.config, [], RuleEvaluator([]))
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="verify-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        k = 0
        while not self._stop.is_set():
            for name, src in self.sources.items():
                state = self.states[name]
                t = self.now_s()
                try:
                    state.add(t, src.read())
                except ZgError as exc:
                    state.errors.append({"t_s": round(t, 3), "error": exc.message})
                except Exception as exc:  # the sampler never takes the run down
                    state.errors.append({"t_s": round(t, 3), "error": f"{type(exc).__name__}: {exc}"})
            k += 1
            self._stop.wait(max(0.0, k * self.interval_s - self.now_s()))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for src in self.sources.values():
            try:
                src.close()
            except Exception:  # closing a reader must not mask the run's outcome
                pass

    def results(self) -> dict[str, dict[str, Any]]:
        """source name -> dcgm.watch data (with the stage bands)."""
        from zgtool.dcgm.watch import result_data

        out = {}
        for name, state in self.states.items():
            state.stopped_by = "verify finished"
            state.elapsed_s = self.now_s()
            data = result_data(state)
            data["stages"] = list(self.stages)
            if name == "engine" and self.gpu_note:
                data["notes"] = [self.gpu_note]
            out[name] = data
        return out
