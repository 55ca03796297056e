"""A served model's own folder on this machine, found from the id the server gives it, for counting tokens
with the model's tokenizer.json and chat template where the server has no tokenize route (`transformers
serve`, or an engine whose route a gateway does not pass on).

Where it looks, in order, for each id:
- the id itself as a path: `transformers serve /models/x` and `vllm serve /models/x` (without
  --served-model-name) list the path as the model's id;
- the Hugging Face hub cache, where `vllm serve org/name` and `transformers serve org/name` download to:
  $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub; the folder
  models--org--name/snapshots/REV, REV from refs/main when it is there, else the newest snapshot.
A folder counts only when it holds a tokenizer.json."""

from __future__ import annotations

import os
from pathlib import Path


def hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def _snapshot(repo: Path) -> Path | None:
    snaps = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file():
        rev = ref.read_text().strip()
        if rev and (snaps / rev / "tokenizer.json").is_file():
            return snaps / rev
    try:
        found = [p for p in snaps.iterdir() if (p / "tokenizer.json").is_file()]
    except OSError:
        return None
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def find_model_dir(model_id: str) -> Path | None:
    """The local folder with `model_id`'s tokenizer.json, or None."""
    if not model_id:
        return None
    try:
        as_path = Path(model_id).expanduser()
        if (as_path / "tokenizer.json").is_file():
            return as_path
    except OSError:
        pass
    parts = model_id.strip("/").split("/")
    if len(parts) != 2 or not all(parts) or any(p in (".", "..") for p in parts):
        return None                       # a hub id is org/name; anything else is no hub id
    return _snapshot(hub_cache() / f"models--{parts[0]}--{parts[1]}")
