"""`zgtool client ask`: one request through the load-hint-aware client (retries, fallback)."""

from __future__ import annotations

from pathlib import Path

import typer

from zgtool.commands import vocabulary as vocab


def register(app: typer.Typer) -> None:
    client_app = typer.Typer(epilog="""Examples:\n\n  zgtool client ask http://127.0.0.1:8000 "Hello"\n""", help="A load-hint-aware client: honest retries and automatic model fallback.",
                             no_args_is_help=True)
    app.add_typer(client_app, name="client")

    @client_app.command("ask")
    def ask_cmd(
        target: str = typer.Argument(..., help="A target name from zgtool.toml or a URL."),
        prompt: str = typer.Argument(..., help="The user message."),
        stream: bool = typer.Option(False, "--stream", help="Stream the answer (SSE)."),
        fallback: list[str] = typer.Option(None, "--fallback", help="Fallback model, in order; repeatable."),
        model: str = typer.Option(None, "--model", "-m", help="Primary model (default: the target's)."),
        api: str = typer.Option(None, "--api", help="anthropic | openai (for URL targets; default anthropic)."),
        system: str = typer.Option(None, "--system", help="System prompt."),
        max_tokens: int = typer.Option(64, "--max-tokens", min=1, help="Most tokens to generate."),
        timeout_s: float = typer.Option(60.0, "--timeout-s", min=0.001, help="Timeout of one attempt."),
        max_attempts: int = typer.Option(4, "--max-attempts", min=1, help="Attempts before giving up."),
        max_wait_s: float = typer.Option(60.0, "--max-wait-s", min=0, help="Longest server-requested wait."),
        util_threshold: float = typer.Option(95.0, "--util-threshold",
                                             help="Fall back only above this load (percent)."),
        fallback_after: int = typer.Option(3, "--fallback-after", min=1,
                                           help="Consecutive timeouts before falling back."),
        not_idempotent: bool = typer.Option(False, "--not-idempotent",
                                            help="Retry only when the server surely did not run it."),
        config: Path = typer.Option(None, "--config", help="zgtool.toml to read."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
        out: Path = typer.Option(None, "-o", "--output", help="Write the JSON result to this file."),
        insecure: bool = typer.Option(False, "--insecure", "-k", help="Do not verify TLS certificates."),
        cacert: Path = typer.Option(None, "--cacert", help="CA bundle for a self-signed target (serve --tls)."),
        header: list[str] = vocab.header(),
    ) -> None:
        """Send one prompt through the policy; show attempts, waits, the chosen model and the load hint.

        \b
        Examples:
          zgtool client ask http://127.0.0.1:8000 "Say hello" --stream
          zgtool client ask https://127.0.0.1:8443 "Hi" --cacert /tmp/tls/cert.pem
          zgtool client ask vllm "Hi" --api openai --fallback small-model --max-attempts 3
        """
        from zgtool.client.cli_run import AskOptions, run_ask
        from zgtool.tlsverify import verify_setting

        run_ask(AskOptions(target=target, prompt=prompt, stream=stream, fallback=tuple(fallback or ()),
                           model=model, api=api, system=system, max_tokens=max_tokens, timeout_s=timeout_s,
                           max_attempts=max_attempts, max_wait_s=max_wait_s, util_threshold_pct=util_threshold,
                           fallback_after=fallback_after, idempotent=not not_idempotent, config=config,
                           as_json=as_json, out=out, verify=verify_setting(insecure, cacert),
                           headers=vocab.headers(header)))
