"""Who counts a workload's tokens: --tokenizer auto|server|URL|PATH|none.

- server: the target's own tokenize route, tried in turn: vLLM's and zgtool's engine's POST /tokenize
  ({"model", "messages"} -> {"count", "tokens"}: the chat template applied, so the count is the prompt
  tokens the server will report; {"prompt"} where messages are refused), llama.cpp's POST /tokenize
  ({"content"} -> {"tokens"}; with its POST /apply-template first, so the count holds the chat template as
  its usage does), TGI's POST /tokenize ({"inputs"} -> [{"id", "text", ...}]), and vLLM's shape at
  /v1/tokenize. An answer that is not one of those shapes, or counts "hello world" as nothing, is not used.
  SGLang serves a native /tokenize too; its answer's shape was not found documented, so it counts here only
  if it answers in one of the shapes above (else the fall-back says so).
  Every target is asked in turn (a gateway listed first does not hide the engine listed after it), then the
  engine behind a gateway that publishes it (LiteLLM's GET /model/info: zgtool.workload.upstream), asked
  without the gateway's key.
- URL: that server's tokenize routes (the engine behind a gateway that does not publish it), its id for the
  model read from its GET /v1/models.
- PATH: a local tokenizer.json, read with the `tokenizers` package (the engine extra): the user text only,
  no chat template.
- none: one filler word per token (zgtool.workload.textgen), as before.
- auto: server; else the model's own folder on this machine (zgtool.workload.modeldir: the id as a path, or
  the Hugging Face hub cache), its tokenizer.json with its chat template as transformers applies it
  (`transformers serve` has no tokenize route); else none.
A source that cannot count falls back to the next, and the fall-back is said (Counter.notes).

Synthetic prompts are then built to hit their requested length exactly under the counter (fit_text)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from zgtool.errors import MissingCapability, TargetUnreachable, UsageError
from zgtool.workload import textgen
from zgtool.workload.model import RequestSpec, Workload

CHOICES = ("auto", "server", "none")
PROBE_TEXT = "hello world"
PAD_MAX = 24                     # letters tried when closing the gap a multi-token last word left


class CannotCount(Exception):
    """A token source that cannot count here (why, in words); the next source is used. `silent`: the server
    did not answer in time (asking it anything more waits as long again)."""

    def __init__(self, why: str, silent: bool = False) -> None:
        super().__init__(why)
        self.silent = silent


@dataclass(frozen=True)
class Counter:
    source: str                      # which source counted, for results: "server POST /tokenize (vllm) at URL"
    count: Callable[[str], int]      # tokens of a user message's text (with the template where `templated`)
    templated: bool = False          # the count includes the chat template (what the server reports)
    notes: tuple[str, ...] = ()      # fall-backs taken on the way
    count_text: Callable[[str], int] | None = None   # a bare text's tokens (an answer's), when `count` is templated

    def public(self) -> dict[str, Any]:
        return {"source": self.source, "chat_template_counted": self.templated, "notes": list(self.notes)}


FILLER = Counter("none: one filler word per token (not the model's tokenizer)",
                 lambda s: len(s.split()), count_text=textgen.approx_tokens)


# -- server routes ------------------------------------------------------------------------------------------
def _vllm_count(doc: Any) -> int | None:
    if isinstance(doc, dict) and isinstance(doc.get("count"), int) and isinstance(doc.get("tokens"), list) \
            and doc["count"] == len(doc["tokens"]):
        return int(doc["count"])
    return None


def _llama_count(doc: Any) -> int | None:
    if isinstance(doc, dict) and set(doc) == {"tokens"} and isinstance(doc["tokens"], list):
        return len(doc["tokens"])
    return None


def _tgi_count(doc: Any) -> int | None:
    if isinstance(doc, list) and all(isinstance(t, dict) and "id" in t for t in doc):
        return len(doc)
    return None


def _routes(model: str) -> list[tuple[str, str, Callable[[str], dict[str, Any]], Callable[[Any], int | None], bool]]:
    """(label, path, body for a text, count from the answer, templated), in the order tried."""
    chat: Callable[[str], dict[str, Any]] = lambda t: {"model": model, "messages": [{"role": "user", "content": t}]}  # noqa: E731
    return [("vllm messages", "/tokenize", chat, _vllm_count, True),
            ("vllm prompt", "/tokenize", lambda t: {"model": model, "prompt": t, "add_special_tokens": False},
             _vllm_count, False),
            ("llama.cpp", "/tokenize", lambda t: {"content": t}, _llama_count, False),
            ("tgi", "/tokenize", lambda t: {"inputs": t, "add_special_tokens": False}, _tgi_count, False),
            ("vllm messages", "/v1/tokenize", chat, _vllm_count, True)]


def server_counter(base: str, model: str, *, headers: dict[str, str], verify: bool | str = True,
                   timeout_s: float = 10.0) -> Counter:
    """A Counter on the first tokenize route at `base` (the URL before /v1) that answers in a known shape;
    CannotCount naming what each route answered."""
    import httpx

    client = httpx.Client(timeout=timeout_s, verify=verify, trust_env=False, headers=headers)
    said = []
    silent = False
    for label, path, body, parse, templated in _routes(model):
        try:
            r = client.post(base + path, content=json.dumps(body(PROBE_TEXT)),
                            headers={"content-type": "application/json"})
            n = parse(r.json()) if r.status_code == 200 else None
        except httpx.TimeoutException:
            said.append(f"{path} ({label}): no answer within {timeout_s:g} s")
            silent = True
            break                       # a silent server: asking its other routes waits as long again
        except (httpx.HTTPError, ValueError):
            said.append(f"{path} ({label}): no usable answer")
            continue
        if n is None or n < 1:
            said.append(f"{path} ({label}): {r.status_code}{' but not its shape' if r.status_code == 200 else ''}")
            continue

        def count(text: str, path: str = path, body: Any = body, parse: Any = parse) -> int:
            return int(_post_count(client, base, path, body, text, parse))

        if label == "llama.cpp" and (chat_count := _llama_chat(client, base)) is not None:
            # llama-server applies its chat template on POST /apply-template: counted as its usage counts
            return Counter(f"server POST /apply-template + {path} ({label}) at {base}", chat_count, True,
                           count_text=count)
        bare = _bare_route(client, base, path, model) if templated else None
        count_text: Callable[[str], int] | None = None
        if bare is not None:
            def count_text(text: str, bare: Callable[[str], dict[str, Any]] = bare, path: str = path) -> int:
                return int(_post_count(client, base, path, bare, text))

        return Counter(f"server POST {path} ({label}) at {base}", count, templated, count_text=count_text)
    raise CannotCount(f"no tokenize route at {base} answered ({'; '.join(dict.fromkeys(said))})", silent)


def _template_prompt(doc: Any) -> str | None:
    return doc["prompt"] if isinstance(doc, dict) and isinstance(doc.get("prompt"), str) else None


def _llama_chat(client: Any, base: str) -> Callable[[str], int] | None:
    """llama-server's count of a user message as its usage reports it: the chat template applied by POST
    /apply-template ({"messages"} -> {"prompt"}), the prompt tokenized by POST /tokenize with special tokens
    added and parsed, as the server tokenizes a chat prompt (llama-server here: 35 for a message its usage
    counted 35, where the bare text is 7). None when /apply-template does not answer in its shape."""
    def count(text: str) -> int:
        prompt = _post_count(client, base, "/apply-template", lambda t: {"messages": [{"role": "user", "content": t}]},
                             text, _template_prompt)
        return int(_post_count(client, base, "/tokenize",
                               lambda p: {"content": p, "add_special": True, "parse_special": True}, prompt,
                               _llama_count))

    try:
        return count if count(PROBE_TEXT) > 0 else None
    except (TargetUnreachable, UsageError):
        return None


def _bare_body(model: str) -> Callable[[str], dict[str, Any]]:
    return lambda t: {"model": model, "prompt": t, "add_special_tokens": False}


def _bare_route(client: Any, base: str, path: str, model: str) -> Callable[[str], dict[str, Any]] | None:
    """vLLM's {"prompt"} form on the route that counted messages, when it answers in its shape."""
    body = _bare_body(model)
    try:
        r = client.post(base + path, content=json.dumps(body(PROBE_TEXT)), headers={"content-type": "application/json"})
        return body if r.status_code == 200 and (_vllm_count(r.json()) or 0) > 0 else None
    except Exception:  # noqa: BLE001 - httpx errors and bad JSON alike: no bare route
        return None


def _post_count(client: Any, base: str, path: str, body: Callable[[str], dict[str, Any]], text: str,
                parse: Callable[[Any], Any] = _vllm_count) -> Any:
    """One count from a tokenize route (``parse`` reads its answer); a route that stops answering, or
    answers out of its shape, mid-run is an error, never a wrong count."""
    import httpx

    try:
        got = parse(client.post(base + path, content=json.dumps(body(text)),
                                headers={"content-type": "application/json"}).json())
    except (httpx.HTTPError, ValueError) as exc:
        raise TargetUnreachable(f"--tokenizer: {base}{path} stopped answering while counting "
                                f"({type(exc).__name__})") from None
    if got is None:
        raise UsageError(f"--tokenizer server: {base}{path} stopped answering in its shape mid-run")
    return got


# -- local files ----------------------------------------------------------------------------------------------
def file_counter(path: Path) -> Counter:
    if not path.is_file():
        raise UsageError(f"--tokenizer {path}: no such file (give a tokenizer.json, or auto|server|none)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise MissingCapability("--tokenizer PATH needs the tokenizers package: pip install 'zgtool[engine]'") \
            from None
    with tempfile.TemporaryDirectory(prefix="zgtool-gguf-tokenizer-") as scratch:   # a GGUF's, while it loads
        json_path = _gguf_tokenizer(path, Path(scratch)) if path.suffix == ".gguf" else path
        try:
            tok = Tokenizer.from_file(str(json_path))
        except Exception as exc:  # noqa: BLE001 - the library raises bare Exceptions on a bad file
            raise UsageError(f"--tokenizer {path}: not a tokenizer.json ({str(exc)[:120]})") from None
    kind = "GGUF" if path.suffix == ".gguf" else "tokenizer.json"
    return Counter(f"{kind} {path} (no chat template)", lambda s: len(tok.encode(s, add_special_tokens=False).ids))


def _gguf_tokenizer(path: Path, out: Path) -> Path:
    """A GGUF's tokenizer as a tokenizer.json in the folder `out`, written by the engine's own GGUF
    converter (byte-level BPE 'gpt2' vocabularies, as llama.cpp's Llama-family GGUFs)."""
    try:
        from gguf import GGUFReader

        from zgtool.engine.gguf_convert import _field, _write_tokenizer
    except ImportError:
        raise MissingCapability("--tokenizer FILE.gguf needs the gguf package: pip install 'zgtool[engine]'") \
            from None
    from zgtool.engine.errors import ModelLoadError

    try:
        reader = GGUFReader(str(path))
        _write_tokenizer(reader, list(_field(reader, "tokenizer.ggml.tokens", [])), out)
    except ModelLoadError as exc:
        raise UsageError(f"--tokenizer {path}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any parse failure of a damaged file
        raise UsageError(f"--tokenizer {path}: not a readable GGUF ({type(exc).__name__})") from None
    return out / "tokenizer.json"


Asked = tuple[str, str, dict[str, str]]     # (a server's URL before /v1, its model id, the headers it gets)


def counter_for(choice: str, base: str, model: str, *, headers: dict[str, str], verify: bool | str = True,
                timeout_s: float = 10.0, more: tuple[Asked, ...] = ()) -> Counter:
    """--tokenizer CHOICE -> the Counter that counts, falling back (auto, server, URL) to the filler words.
    `base`/`model`/`headers` are the first target's; `more` the other targets', asked after it."""
    if choice.startswith(("http://", "https://")):
        return _url_counter(choice, [(base, model, headers), *more], verify, timeout_s)
    if choice not in CHOICES:
        return file_counter(Path(choice).expanduser())
    if choice == "none":
        return FILLER
    asked: list[Asked] = []
    for one in [(base, model, headers), *more]:
        if one[0] and all(one[0] != b for b, _, _ in asked):
            asked.append(one)
    notes: list[str] = []
    silent: set[str] = set()
    for b, m, h in asked:
        try:
            return server_counter(b, m, headers=h, verify=verify, timeout_s=timeout_s)
        except CannotCount as exc:
            notes.append(str(exc))
            if exc.silent:
                silent.add(b)
    ids = [m for _, m, _ in asked]
    for b, m, h in asked:
        if b in silent:
            continue
        found = _upstream_counter(b, m, h, verify, timeout_s, notes)
        if isinstance(found, Counter):
            return found
        ids += found
    if choice == "auto":
        local = local_counter(list(dict.fromkeys(ids)), notes)
        if local is not None:
            return local
    return replace(FILLER, notes=(f"--tokenizer {choice}: {'; '.join(notes)}; counted with filler words instead"
                                  " (--tokenizer URL counts on the engine behind a gateway, PATH with a "
                                  "tokenizer.json)",))


def _upstream_counter(base: str, model: str, headers: dict[str, str], verify: bool | str, timeout_s: float,
                      notes: list[str]) -> Counter | list[str]:
    """A counter on the engine a gateway at `base` publishes for `model`, or the engines' model ids."""
    import httpx

    from zgtool.workload.upstream import published_upstreams

    with httpx.Client(timeout=timeout_s, verify=verify, trust_env=False, headers=headers) as client:
        ups = published_upstreams(client, base, model)
    for up in ups:
        try:
            c = server_counter(up.base, up.model, headers={}, verify=verify, timeout_s=timeout_s)
        except CannotCount as exc:
            notes.append(f"the engine behind it ({up.via}): {exc}")
            continue
        return replace(c, source=f"{c.source}, the engine behind {base} ({up.via})")
    return [up.model for up in ups]


def _url_counter(url: str, targets: list[Asked], verify: bool | str, timeout_s: float) -> Counter:
    """--tokenizer URL: that server's routes, for the targets' model where it lists it (else the first model
    it lists); the targets' headers only where it is one of them (a key is not sent to another server)."""
    from zgtool.workload.upstream import strip_v1

    base = strip_v1(url)
    model = targets[0][1]
    headers = next((h for b, _, h in targets if b == base), {})
    listed = _listed_model(base, model, headers, verify, timeout_s)
    try:
        c = server_counter(base, listed, headers=headers, verify=verify, timeout_s=timeout_s)
        return c if listed == model else replace(c, source=f"{c.source} (its model {listed!r})")
    except CannotCount as exc:
        return replace(FILLER, notes=(f"--tokenizer {url}: {exc}; counted with filler words instead",))


def _listed_model(base: str, model: str, headers: dict[str, str], verify: bool | str, timeout_s: float) -> str:
    """`model` when the server at `base` lists it (or lists nothing readable), else the first model it lists (its
    served model: our engine and vLLM list aliases after it)."""
    import httpx

    try:
        doc = httpx.get(base + "/v1/models", headers=headers, verify=verify, timeout=timeout_s,
                        trust_env=False).json()
        ids = [d["id"] for d in doc["data"] if isinstance(d, dict) and isinstance(d.get("id"), str)]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return model
    return ids[0] if ids and model not in ids else model


def local_counter(model_ids: list[str], notes: list[str]) -> Counter | None:
    """The first of `model_ids` whose folder is on this machine (zgtool.workload.modeldir), counted with its
    tokenizer.json and chat template; None (a note said) when none is, or the engine extra is missing."""
    from zgtool.workload.modeldir import find_model_dir

    found = next(((m, d) for m in model_ids if (d := find_model_dir(m)) is not None), None)
    if found is None:
        return None
    model, folder = found
    try:
        import jinja2  # noqa: F401 - the chat template's renderer
        import tokenizers  # noqa: F401

        from zgtool.engine.tokenizer import HFTokenizer
    except ImportError:
        notes.append(f"{model}'s tokenizer.json is in {folder}, but counting with it needs the tokenizers and "
                     "jinja2 packages: pip install 'zgtool[engine]'")
        return None
    try:
        tok = HFTokenizer(folder, (), None)
    except Exception as exc:  # noqa: BLE001 - tokenizers raises bare Exceptions on a bad file
        notes.append(f"{folder}/tokenizer.json could not be read ({str(exc)[:120]})")
        return None
    where = (f"the served model's folder {folder}" if Path(model).expanduser() == folder
             else f"{model}'s folder on this machine, {folder}")
    if not tok.has_chat_template:
        return Counter(f"tokenizer.json in {where} (it has no chat template)", lambda s: len(tok.encode(s)))

    def count(text: str) -> int:
        return len(tok.apply_chat_template([{"role": "user", "content": text}]))

    return Counter(f"tokenizer.json in {where} (chat template from {tok.chat_template_source})", count, True,
                   count_text=lambda s: len(tok.encode(s)))


# -- prompts to an exact length --------------------------------------------------------------------------------
def fit_text(counter: Counter, n: int, seed: str) -> tuple[str, int]:
    """Filler text whose count under `counter` is exactly n where the tokenizer allows it, and that count:
    the fewest words reaching n (binary search), then single letters added to close a gap of more than one."""
    pool = textgen.words(2 * n + 16, seed)
    lo, hi = 0, len(pool)
    while lo < hi:                                  # fewest words whose count reaches n
        mid = (lo + hi) // 2
        if counter.count(" ".join(pool[:mid])) >= n:
            hi = mid
        else:
            lo = mid + 1
    text = " ".join(pool[:lo])
    got = counter.count(text)
    if got > n and lo > 0:                          # the last word overshot: close the gap with letters
        base = " ".join(pool[:lo - 1])
        for pad in (lambda k: "a" * k, lambda k: " " + "a" * k, lambda k: " a" * k):
            for k in range(1, PAD_MAX):
                cand = base + pad(k)
                c = counter.count(cand)
                if c == n:
                    return cand, c
                if c > n:
                    break
    return text, got


def refit(workload: Workload, counter: Counter) -> tuple[Workload, tuple[int, ...]]:
    """A synthetic workload's prompts rebuilt to their requested lengths under `counter`, and each one's count
    under it (a dataset's prompts are counted as they are; a ShareGPT answer's length, its max_tokens, is
    recounted as a bare text)."""
    specs: list[RequestSpec] = []
    counts: list[int] = []
    bare = counter.count_text or (None if counter.templated else counter.count)
    for i, spec in enumerate(workload.specs):
        if spec.input_tokens is not None:
            text, got = fit_text(counter, spec.input_tokens, f"{workload.name}-{i}")
            spec = replace(spec, messages=(("user", text),))
        elif spec.reference_output is not None and bare is not None:     # ShareGPT: the answer's own length
            spec = replace(spec, max_tokens=max(1, bare(spec.reference_output)))
            got = counter.count("\n".join(t for _, t in spec.messages))
        else:
            got = counter.count("\n".join(t for _, t in spec.messages))
        specs.append(spec)
        counts.append(got)
    return replace(workload, specs=tuple(specs)), tuple(counts)
