"""GGUF files of the same weights for the llama.cpp peers, in the run's dtype and in llama.cpp's best.

Conversion uses convert_hf_to_gguf.py from the llama-cpp-python sdist bench/setup_peers.sh
unpacks, with the gguf-py vendored beside it (PyPI gguf lacks what it imports), run by the llama
venv's Python. Files of a cached HF directory are cached under <peers>/gguf/ by that directory's
name (it carries the package version and a hash); others are written next to the run's files.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from peers_types import SETUP_HINT, GgufFile, peers_dir

# the run's dtype (torch's name) -> convert_hf_to_gguf.py's --outtype
LLAMA_OUTTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def llama_src() -> Path:
    return peers_dir() / "llama-sdist" / "src" / "vendor" / "llama.cpp"


def convert_command(hf_dir: Path, out: Path, outtype: str, byte_vocab: bool = False) -> tuple[list[str], dict[str, str]]:
    """The converter's command line; byte_vocab: through bench/peerlib/peers_convert_bytes.py (dummy tokenizers)."""
    src = llama_src()
    py = peers_dir() / "llama" / "bin" / "python"
    script = ([str(Path(__file__).with_name("peers_convert_bytes.py")), str(src)] if byte_vocab
              else [str(src / "convert_hf_to_gguf.py")])
    argv = [str(py), *script, str(hf_dir), "--outfile", str(out), "--outtype", outtype]
    return argv, {"PYTHONPATH": str(src / "gguf-py")}


def convert(hf_dir: Path, out: Path, outtype: str, timeout_s: float = 900, byte_vocab: bool = False) -> GgufFile | str:
    """The GGUF at `out` (converted once; an existing file is reused); a reason string when it can't be."""
    if out.exists() and out.stat().st_size > 0:
        return GgufFile(outtype, out, f"{outtype} (converted, cached)")
    argv, env = convert_command(hf_dir, out, outtype, byte_vocab)
    if not (llama_src() / "convert_hf_to_gguf.py").exists() or not Path(argv[0]).exists():
        return f"convert_hf_to_gguf.py not found ({SETUP_HINT} --only llama)"
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    argv[argv.index("--outfile") + 1] = str(part)
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **env}, timeout=timeout_s)
    if proc.returncode != 0 or not part.exists():
        part.unlink(missing_ok=True)
        lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        return f"convert_hf_to_gguf.py failed: {(lines[-1] if lines else 'no output')[:160]}"
    part.replace(out)
    return GgufFile(outtype, out, f"{outtype} (converted)")


def same_dtype_gguf(hf_dir: Path, dtype: str, cache: bool, tmp: Path, byte_vocab: bool = False) -> GgufFile | str:
    """The HF directory in the run's dtype: llama.cpp's same-dtype row."""
    outtype = LLAMA_OUTTYPE.get(dtype)
    if outtype is None:
        return f"no GGUF type for dtype {dtype!r}"
    where = peers_dir() / "gguf" if cache else tmp
    return convert(hf_dir, where / f"{hf_dir.name}.{outtype}.gguf", outtype, byte_vocab=byte_vocab)


def gguf_dtype_of(path: Path) -> str:
    """The quantisation a GGUF's file name states (SmolLM2-135M-Instruct.Q4_1.gguf -> Q4_1)."""
    stem = path.name.removesuffix(".gguf")
    return stem.rsplit(".", 1)[-1] if "." in stem else "gguf"
