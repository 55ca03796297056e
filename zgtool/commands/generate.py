"""`zgtool generate`: run the engine in-process on one prompt, streaming the text."""

from __future__ import annotations

import json
import sys

import typer


def register(app: typer.Typer) -> None:
    @app.command("generate")
    def generate_cmd(
        model: str = typer.Option("dummy:small", "--model", "-m", help="dummy:<tiny|small|llama-1b>, null, or a local HF directory."),
        prompt: str = typer.Option("Explain what a gateway adds to an LLM request.", "--prompt", "-p"),
        max_tokens: int = typer.Option(64, "--max-tokens", "-n", help="Tokens to generate (>= 1)."),
        temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 = greedy."),
        top_p: float = typer.Option(1.0, "--top-p"),
        top_k: int = typer.Option(0, "--top-k"),
        seed: int = typer.Option(None, "--seed", help="Per-request sampling seed."),
        raw: bool = typer.Option(False, "--raw", help="Feed the prompt as is, without the chat template."),
        deterministic: bool = typer.Option(False, "--deterministic", help="Batch-invariant mode."),
        device: str = typer.Option("auto", "--device", help="auto | cpu | cuda"),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming text."),
    ) -> None:
        """Generate text in-process and print TTFT and tok/s (no server involved)."""
        from zgtool.engine.errors import EngineError
        from zgtool.errors import UsageError

        try:
            _run(model, prompt, max_tokens, temperature, top_p, top_k, seed, raw, deterministic, device, as_json)
        except EngineError as exc:
            raise UsageError(str(exc)) from exc


def _run(model: str, prompt: str, max_tokens: int, temperature: float, top_p: float, top_k: int,
         seed: int | None, raw: bool, deterministic: bool, device: str, as_json: bool) -> None:
    from zgtool.engine import Engine, EngineConfig, SamplingParams
    from zgtool.output import err_console

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    engine = Engine(EngineConfig(model=model, deterministic=deterministic, device=device))
    tok = engine.tokenizer
    ids = tok.encode(prompt, add_special_tokens=True) if raw else tok.apply_chat_template(
        [{"role": "user", "content": prompt}])
    if engine.is_dummy and not as_json:
        err_console.print(f"[dim]{model}: random weights — the text is meaningless by design[/dim]")
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
    if as_json:
        from zgtool.results import make_result

        data = {"model": model, "device": engine.device, "dtype": engine.dtype, "prompt": prompt,
                "prompt_token_ids": ids, "output_token_ids": out_ids, "text": "".join(text_parts),
                "finish_reason": finish, "ttft_ms": ttft, "total_ms": t.total_ms, "decode_tok_s": tok_s,
                "is_dummy": engine.is_dummy}
        sys.stdout.write(json.dumps(make_result("generate", data)) + "\n")
        return
    sys.stdout.write("\n")
    err_console.print(f"[bold]{n}[/bold] tokens, finish={finish}, TTFT {ttft:.1f} ms, "
                      f"{tok_s:.1f} tok/s decode, total {t.total_ms:.1f} ms ({engine.device}, {engine.dtype})")
