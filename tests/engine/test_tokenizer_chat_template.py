"""Where a checkpoint's chat template is read from, and the loud warning when there is none."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from zgtool.engine.tokenizer import HFTokenizer
from zgtool.engine.weights import save_dummy_checkpoint

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
OTHER = "{% for m in messages %}<|user|>{{ m['content'] | upper }}{% endfor %}<|assistant|>"
MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return save_dummy_checkpoint("tiny", tmp_path / "tiny")


def _tok(d: Path) -> HFTokenizer:
    return HFTokenizer(d, (257,), 256)


def test_chat_template_jinja_is_read_where_current_transformers_saves_it(ckpt: Path) -> None:
    (ckpt / "chat_template.jinja").write_text(TEMPLATE)
    tok = _tok(ckpt)
    assert tok.has_chat_template and tok.chat_template_source == "chat_template.jinja"
    assert tok.render_chat(MSGS) == "<|user|>hi<|end|><|assistant|>"
    assert tok.apply_chat_template(MSGS) == [259, *b"hi", 261, 260]     # specials are single tokens, no extra BOS


def test_tokenizer_config_chat_template_string_and_named_list(ckpt: Path) -> None:
    cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    (ckpt / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TEMPLATE}))
    assert _tok(ckpt).render_chat(MSGS) == "<|user|>hi<|end|><|assistant|>"
    named = [{"name": "tool_use", "template": OTHER}, {"name": "default", "template": TEMPLATE}]
    (ckpt / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": named}))
    tok = _tok(ckpt)
    assert tok.chat_template_source == "tokenizer_config.json" and tok.render_chat(MSGS).endswith("<|assistant|>")


def test_jinja_file_wins_over_tokenizer_config(ckpt: Path) -> None:
    cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    (ckpt / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": OTHER}))
    (ckpt / "chat_template.jinja").write_text(TEMPLATE)
    assert _tok(ckpt).render_chat(MSGS) == "<|user|>hi<|end|><|assistant|>"


def test_no_template_warns_loudly_and_falls_back_to_role_lines(ckpt: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="zgtool.engine.tokenizer"):
        tok = _tok(ckpt)
    assert not tok.has_chat_template and tok.chat_template_source is None
    assert any("no chat template" in r.getMessage() for r in caplog.records)
    assert tok.render_chat(MSGS, system="be brief") == "system: be brief\nuser: hi\nassistant:"
    assert tok.apply_chat_template(MSGS)[0] == 256                        # the fallback leads with BOS


def test_template_features_transformers_provides(ckpt: Path) -> None:
    """raise_exception, loop controls and tojson work as in transformers' renderer."""
    (ckpt / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
        "{{ m | tojson }}{% endfor %}{% if messages | length > 2 %}{{ raise_exception('too many') }}{% endif %}")
    tok = _tok(ckpt)
    assert tok.render_chat(MSGS, system="s") == '{"role": "user", "content": "hi"}'
    with pytest.raises(ValueError, match="too many"):
        tok.render_chat([*MSGS, *MSGS], system="s")
