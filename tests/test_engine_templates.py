"""Template choice and stop policy: pure checks, and the family fallback on a real engine."""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import AutoTokenizer

from vllm_inline.engine import ChatTemplateError, get_engine
from vllm_inline.engine.life.stops import decide_stop_policy
from vllm_inline.engine.life.templates import (
    FAMILIES,
    detect_family,
    require_template,
    resolve_chat_template,
)

USER = [{"role": "user", "content": "hi"}]


def test_choice_order_override_then_own_then_fallback():
    llama_vocab = {"<|start_header_id|>": 1, "<|end_header_id|>": 2, "<|eot_id|>": 3}
    assert resolve_chat_template("{{ x }}", llama_vocab, "{{ y }}").source == "override"
    assert resolve_chat_template("{{ x }}", llama_vocab).source == "tokenizer"
    assert resolve_chat_template(None, llama_vocab).source == "fallback:llama3"
    assert (
        resolve_chat_template(None, {"<|im_start|>": 1, "<|im_end|>": 2}).source
        == "fallback:chatml"
    )
    assert (
        resolve_chat_template(None, {"<start_of_turn>": 1, "<end_of_turn>": 2}).source
        == "fallback:gemma"
    )
    none = resolve_chat_template(None, {"hello": 1})
    with pytest.raises(ChatTemplateError, match="chat_template="):
        require_template(none, "my-model")


def test_stop_policy_collects_every_end_of_turn_id():
    vocab = {
        "<|start_header_id|>": 1,
        "<|end_header_id|>": 2,
        "<|eot_id|>": 3,
        "<|end_of_text|>": 4,
        "x": 5,
    }
    policy = decide_stop_policy(
        vocab, tokenizer_eos_id=4, generation_config_eos=[4, 3], template_source="tokenizer"
    )
    assert policy.stop_token_ids == (4, 3)
    assert policy.stop_tokens == ("<|end_of_text|>", "<|eot_id|>")
    assert policy.family == "llama3"
    # the family's end-of-turn token is added even when the configs forget it
    assert 3 in decide_stop_policy(vocab, 4, None, "tokenizer").stop_token_ids


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_fallback_templates_render_tools_and_multi_turn(family):
    from jinja2 import Environment

    template = Environment().from_string(family.template)
    text = template.render(
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
        tools=[
            {
                "type": "function",
                "function": {"name": "get_weather", "parameters": {"type": "object"}},
            }
        ],
        add_generation_prompt=True,
        bos_token="<s>",
    )
    assert "Weather?" in text and "sunny" in text and "Be brief." in text
    assert (
        all(marker in text for marker in family.markers if marker not in ("<|eot_id|>",))
        or family.name == "llama3"
    )
    assert detect_family({m: i for i, m in enumerate(family.markers)}) is family


def test_known_family_without_template_uses_the_fallback(scripted, tmp_path):
    """A Llama-3 tokenizer saved without its template still chats, through the fallback."""
    s = scripted("llama3")
    path = tmp_path / "llama3-no-template"
    shutil.copytree(s.path, path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "chat_template.jinja").unlink(missing_ok=True)
    assert AutoTokenizer.from_pretrained(path).chat_template is None
    engine = get_engine(str(path), **s.engine_kwargs)
    try:
        assert engine.stop_policy.template_source == "fallback:llama3"
        deltas = list(engine.stream(USER))
        assert "".join(d.text for d in deltas) == s.scenario.answer
        assert deltas[-1].finish_reason == "stop"
    finally:
        engine.shutdown()
