"""GPU tests: everything here is `@pytest.mark.gpu` and skipped where CUDA is absent.

`scripts/gpu_check.sh` runs them on a device machine (`pytest -m gpu`); the CPU suite only
collects them, so a broken import here still fails CI.
"""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):  # noqa: ARG001
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run scripts/gpu_check.sh on one)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _exact_fp32_matmul():
    """TF32 would make fp32 parity a tf32 comparison; the tests state their precision."""
    if not torch.cuda.is_available():
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
