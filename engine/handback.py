"""The step thread's deferred hand-back (engine/drivers.py ``StepThread.run``): a ModelRunner that says when a
step's inputs are ready and only its C call is left.

Handing a step's outputs to the event loop right after the step wakes the loop thread while
the step thread still runs Python (the next step's bookkeeping and inputs): on 2 busy cores
the woken loop thread preempts it, finds the GIL taken and sleeps again (two context switches
per token, and a longer gap between C calls while the kernel pool spins). Handed back from
``prepared()`` instead, the loop thread wakes as the C call releases the GIL: no GIL wait.
(dummy:small, 2 threads, one served stream: the gap between C calls 118-129 -> 69-71 us.)
With one running sequence the engine also waits (bounded) for the loop to write the token
before the C call, so the loop's CPU never preempts the kernel pool mid-step (drivers.py
``StepThread.prepared``). This is the one hand-back mode: over 10 A/B pairs it beat handing back without
that wait (served c=1 ITL p50 median -5%), which beat handing back after each step (-2..-12%).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from zgtool.engine.model import AttnMeta
from zgtool.engine.model_runner import ModelRunner
from zgtool.engine.scheduler import ScheduledBatch


class HandbackRunner(ModelRunner):
    """ModelRunner whose ``prepared`` callback (if set) runs after prepare(), before the forward."""

    prepared: Callable[[], None] | None = None

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, AttnMeta, list[int]]:
        out = super().prepare(batch)
        hook = self.prepared
        if hook is not None:
            hook()
        return out
