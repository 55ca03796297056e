"""Fixtures for report tests: the recorded results and a headless Chromium that reports console output."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")
# Chromium prints every console message and uncaught exception of the page as
#   [pid:tid:date:INFO:CONSOLE:12] "Uncaught Error: boom", source: file:///... (12)
_CONSOLE = re.compile(r":CONSOLE[:(\]]")


@dataclass
class BrowserRun:
    console: list[str]
    dom: str
    screenshot: Path | None


def chromium_binary() -> str | None:
    for c in CHROMIUM_CANDIDATES:
        found = shutil.which(c)
        if found:
            return found
    return None


def open_in_chromium(page: Path, screenshot: Path | None = None, *, height: int = 2400, width: int = 1280) -> BrowserRun:
    """Load the page twice (screenshot, then --dump-dom), offline, with a throwaway profile."""
    binary = chromium_binary()
    assert binary is not None
    base = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr",
            "--v=0", "--no-first-run", "--host-resolver-rules=MAP * ~NOTFOUND", f"--window-size={width},{height}"]
    console: list[str] = []
    dom = ""
    with tempfile.TemporaryDirectory(prefix="zg-chromium-") as profile:
        for action in (["--screenshot=" + str(screenshot)] if screenshot else []) + ["--dump-dom"]:
            proc = subprocess.run([*base, f"--user-data-dir={profile}", action, page.resolve().as_uri()],
                                  capture_output=True, text=True, timeout=120)
            console += [line for line in proc.stderr.splitlines() if _CONSOLE.search(line)]
            if action == "--dump-dom":
                dom = proc.stdout
    return BrowserRun(console, dom, screenshot)


@pytest.fixture(scope="session")
def chromium() -> str:
    binary = chromium_binary()
    if binary is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)")
    return binary


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def browser(chromium: str):  # noqa: ANN201 - the open_in_chromium function
    return open_in_chromium
