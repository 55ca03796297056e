"""Tokenizers: tokenizer.json via `tokenizers` (+ chat template), and a byte-level one for dummy/null models."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Protocol

from zgtool.engine.errors import ModelLoadError

Message = dict[str, str]
log = logging.getLogger(__name__)


# A text longer than this is encoded by the batch API, which lets go of the GIL (encode holds it:
# 1.6 s for 1 MB of text on SmolLM2's tokenizer, every other thread, the event loop included, stopped)
GIL_FREE_ENCODE_CHARS = 8192


class Tokenizer(Protocol):
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    vocab_size: int
    # the most input characters one token can stand for (None: no bound is known): a text of
    # n characters is at least ceil(n / max_token_chars) tokens, known before it is tokenized
    max_token_chars: int | None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def apply_chat_template(self, messages: list[Message], system: str | None = None) -> list[int]: ...


_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "ta", "vo", "zi", "pe", "su", "da", "fo", "gi", "ha", "jo", "ba")


class ByteTokenizer:
    """Bytes 0-255, then <bos>=256, <eos>=257, <|system|>, <|user|>, <|assistant|>, <|end|>;
    ids above those decode to synthetic syllables, so random dummy models print word-like
    (meaningless) text."""

    BOS, EOS, SYSTEM, USER, ASSISTANT, END = 256, 257, 258, 259, 260, 261
    NUM_SPECIAL = 6
    SPECIAL_TEXT = {256: "<bos>", 257: "<eos>", 258: "<|system|>", 259: "<|user|>", 260: "<|assistant|>", 261: "<|end|>"}

    def __init__(self, vocab_size: int = 512) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids: tuple[int, ...] = (self.EOS,)
        self.bos_token_id: int | None = self.BOS
        self.max_token_chars: int | None = 1    # one token per byte: at least one per character
        # every id's bytes, computed once: decode runs twice per generated token (detok.py); a dict,
        # so an id outside the vocabulary (negative too) misses instead of indexing from the end
        self._pieces = {i: self._piece(i) for i in range(vocab_size)}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.BOS, *ids] if add_special_tokens else ids

    def _piece(self, i: int) -> bytes:
        if i < 256:
            return bytes((i,))
        if i in self.SPECIAL_TEXT:
            return b""  # specials are not shown in generated text
        n = i - 256 - self.NUM_SPECIAL
        return (" " + _SYLLABLES[n % 16] + _SYLLABLES[(n // 16) % 16]).encode()

    def decode(self, ids: list[int]) -> str:
        table = self._pieces
        try:
            raw = b"".join([table[i] for i in ids])
        except (KeyError, TypeError):   # ids outside the table: _piece's own answer (or error)
            raw = b"".join(self._piece(i) for i in ids)
        return raw.decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[Message], system: str | None = None) -> list[int]:
        ids = [self.BOS]
        if system:
            ids += [self.SYSTEM, *system.encode("utf-8"), self.END]
        for m in messages:
            ids.append(self.USER if m["role"] == "user" else self.ASSISTANT if m["role"] == "assistant" else self.SYSTEM)
            ids += [*m["content"].encode("utf-8"), self.END]
        ids.append(self.ASSISTANT)
        return ids


class HFTokenizer:
    """tokenizer.json through the `tokenizers` library; the chat template from `chat_template.jinja`
    (where transformers >= 4.47 saves it) or `tokenizer_config.json` `chat_template`, rendered the
    way transformers' `apply_chat_template(..., add_generation_prompt=True)` renders it."""

    def __init__(self, model_dir: Path, eos_from_config: tuple[int, ...], bos_from_config: int | None) -> None:
        from tokenizers import Tokenizer as _Tok

        path = model_dir / "tokenizer.json"
        if not path.exists():
            raise ModelLoadError(f"{model_dir} has no tokenizer.json")
        self._tok = _Tok.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        cfg: dict[str, Any] = {}
        cfg_path = model_dir / "tokenizer_config.json"
        if cfg_path.exists():
            try:
                cfg = json.loads(cfg_path.read_text())
            except json.JSONDecodeError as exc:
                raise ModelLoadError(f"{cfg_path}: invalid JSON: {exc}") from exc
        self._template, self.chat_template_source = read_chat_template(model_dir, cfg)
        if self._template is None:
            log.warning("%s has no chat template (neither chat_template.jinja nor tokenizer_config.json "
                        "'chat_template'): chat requests fall back to plain 'role: content' lines, which a chat "
                        "model answers badly", model_dir)
        self._bos_text = _token_text(cfg.get("bos_token"))
        self._eos_text = _token_text(cfg.get("eos_token"))
        eos = list(eos_from_config)
        if self._eos_text and (tid := self._tok.token_to_id(self._eos_text)) is not None and tid not in eos:
            eos.append(tid)
        self.eos_token_ids = tuple(eos)
        self.bos_token_id = bos_from_config
        self._compiled: Any = None
        self.max_token_chars = max_token_chars(json.loads(path.read_text(encoding="utf-8")))

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if len(text) > GIL_FREE_ENCODE_CHARS:      # the same ids, without holding the GIL
            return list(self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids)
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=True))

    def render_chat(self, messages: list[Message], system: str | None = None) -> str:
        msgs = ([{"role": "system", "content": system}] if system else []) + list(messages)
        if self._template is None:
            return "".join(f"{m['role']}: {m['content']}\n" for m in msgs) + "assistant:"
        if self._compiled is None:
            self._compiled = _compile_template(self._template)
        return str(self._compiled.render(messages=msgs, add_generation_prompt=True,
                                         bos_token=self._bos_text or "", eos_token=self._eos_text or ""))

    def apply_chat_template(self, messages: list[Message], system: str | None = None) -> list[int]:
        text = self.render_chat(messages, system)
        # the template writes its own specials; without one, the model's BOS (if it has one) leads
        return self.encode(text, add_special_tokens=self._template is None)


# normalizers that never leave fewer characters than they were given (anything else: no bound)
_LENGTH_KEEPING = frozenset({"Prepend", "Lowercase", "NFD"})


def _keeps_length(norm: Any) -> bool:
    if norm is None:
        return True
    if not isinstance(norm, dict):
        return False
    kind = norm.get("type")
    if kind == "Sequence":
        return all(_keeps_length(n) for n in norm.get("normalizers") or [])
    if kind == "Replace":
        pattern, content = norm.get("pattern") or {}, norm.get("content")
        return isinstance(pattern.get("String"), str) and isinstance(content, str) and \
            len(content) >= len(pattern["String"])
    return kind in _LENGTH_KEEPING


# pre-tokenizers that drop no character (Whitespace and BERT's drop every space: no bound)
_KEEPING_PRE = frozenset({"ByteLevel", "Metaspace", "Digits", "Punctuation", "UnicodeScripts"})


def _keeps_chars(pre: Any) -> bool:
    if pre is None:
        return True
    if not isinstance(pre, dict):
        return False
    kind = pre.get("type")
    if kind == "Sequence":
        return all(_keeps_chars(p) for p in pre.get("pretokenizers") or [])
    if kind == "Split":
        return pre.get("behavior") != "Removed"
    return kind in _KEEPING_PRE


def _unk_unbounded(model: dict[str, Any]) -> bool:
    """Whether one unknown token can stand for a run of characters of any length."""
    kind = model.get("type")
    if kind == "BPE":
        return bool(model.get("fuse_unk")) and model.get("unk_token") is not None
    if kind == "Unigram":
        return model.get("unk_id") is not None and not model.get("byte_fallback")
    return kind != "WordPiece"      # WordPiece: up to max_input_chars_per_word (below); others unknown


def max_token_chars(doc: dict[str, Any]) -> int | None:
    """The most input characters one token of this tokenizer.json can cover: its longest vocabulary
    entry or added token, in characters (a byte-level token's characters are its bytes, a
    SentencePiece token's its characters, so neither covers more). None where that does not hold:
    a normalizer that could shorten the text, a pre-tokenizer that drops characters, an unknown
    token that can swallow any run of characters (then no bound is claimed)."""
    model = doc.get("model") or {}
    if not (_keeps_length(doc.get("normalizer")) and _keeps_chars(doc.get("pre_tokenizer"))) or \
            _unk_unbounded(model):
        return None
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        pieces: list[Any] = list(vocab)
    elif isinstance(vocab, list):        # Unigram: [[piece, score], ...]
        pieces = [v[0] for v in vocab if isinstance(v, list) and v]
    else:
        return None
    pieces += [a.get("content") for a in doc.get("added_tokens") or [] if isinstance(a, dict)]
    longest = max((len(p) for p in pieces if isinstance(p, str)), default=0)
    if model.get("type") == "WordPiece":      # an unknown word of up to this many characters is one token
        longest = max(longest, int(model.get("max_input_chars_per_word") or 100))
    return longest or None


def read_chat_template(model_dir: Path, tokenizer_config: dict[str, Any]) -> tuple[str | None, str | None]:
    """(template, where it came from): chat_template.jinja first (current transformers), then
    tokenizer_config.json's `chat_template` (a string, or a list of named templates: 'default')."""
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        text = jinja.read_text()
        if text.strip():
            return text, "chat_template.jinja"
    value = tokenizer_config.get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    if isinstance(value, str) and value.strip():
        return value, "tokenizer_config.json"
    return None, None


def _compile_template(template: str) -> Any:
    """The environment transformers renders chat templates in (sandboxed, trim/lstrip blocks,
    loop controls, raise_exception, tojson, strftime_now)."""
    import datetime

    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def _raise(msg: str) -> None:
        raise ValueError(msg)

    def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
                sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols],
                                        undefined=jinja2.Undefined)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(template)


def _token_text(tok: Any) -> str | None:
    if isinstance(tok, dict):
        return tok.get("content")
    return tok if isinstance(tok, str) else None


def write_byte_tokenizer_json(path: Path, vocab_size: int) -> None:
    """A tokenizer.json equivalent to ByteTokenizer's encoding (for dummy HF checkpoints):
    one token per byte (ByteLevel alphabet), specials, and filler tokens up to vocab_size."""
    from tokenizers import Tokenizer as _Tok
    from tokenizers import decoders, models, pre_tokenizers, processors

    # ByteLevel maps byte b to a printable char; order the vocab so id == byte value
    byte_to_char = _bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(256)}
    specials = ["<bos>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
    for i, s in enumerate(specials):
        vocab[s] = 256 + i
    for i in range(256 + len(specials), vocab_size):
        vocab[f"<w{i}>"] = i
    tok = _Tok(models.WordLevel(vocab=vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False), pre_tokenizers.Split("", "isolated")]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    # like Llama's tokenizer.json: encode(add_special_tokens=True) starts with <bos>
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B",
                                                       special_tokens=[("<bos>", 256)])
    tok.save(str(path))


def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}
