"""Building a scripted model: a real checkpoint whose greedy output is known in advance.

:func:`build_scripted_model` writes a complete Hugging Face model directory (``config.json``,
``model.safetensors``, ``generation_config.json``, ``tokenizer.json``,
``tokenizer_config.json`` with the family's chat template, and the kit's own ``scenario.json``)
that vLLM and ``transformers`` load like any other ``LlamaForCausalLM``.

How a model follows its script: one layer, hidden size 1024 (>= vocabulary), identity
embeddings, all RMSNorm weights 1, zero MLP, and ``lm_head[next, prev] = 10`` for each
consecutive pair of a script. The residual stream carries the current token unchanged, so the
model is a bigram table: the token that ends the prompt picks the first script token, and each
script token picks the next. Every script piece is its own token (an added token unless it is
already a single token of the base vocabulary), and the tokens that end the prompts are never
script tokens with a different successor (checked at build time).

A script is: the answer, the end-of-turn token a correct integration stops at, then a
hallucinated tail (an invented next turn) that loops back to the stop token, so with
``ignore_eos=True`` the model keeps inventing turns until ``max_tokens``.

One model can hold several chains when their prompts end differently (a completion prompt,
Qwen3's ``enable_thinking=False`` prompt). The ``chatml_tools`` model tells "after a tool
result" from "after a user turn" although both prompts end with ``<|im_start|>assistant\\n``:
its one attention head lets the prompt-ending token attend to ``</tool_response>``, which
writes a flag into the last (spare) hidden dimension that switches the first token from the tool
call to the final answer. So the real Qwen2.5 template is used unchanged, and the answer comes
only if the integration really rendered the tool result into the prompt.

Nothing heavy is imported at module import: ``numpy``, ``tokenizers`` and ``safetensors``
(all ``transformers`` dependencies) load inside :func:`build_scripted_model`. Building takes
well under a second and is safe when several processes build the same scenario at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from typing import Any

from .cache import build_once, kit_digest
from .families import FAMILIES
from .scenarios import SCENARIOS, Chain, Scenario

__all__ = ["build_scripted_model"]

#: Part of the cache key, with the scenario and the kit's sources (any edit rebuilds).
_BUILD_VERSION = "1"

_HIDDEN = 1024  # >= vocabulary (identity embeddings), with room for a BPE that keeps prompts short
_HEADS = 4  # x head_dim 64 (the CPU attention kernel rejects head_dim 16); 4 * 64 < hidden is fine
_HEAD_DIM = 64
_INTERMEDIATE = 64
_STEP = 10.0  # lm_head weight of a script step; logit ~ 10 * sqrt(1024) = 320
_FLAG_DIM = _HIDDEN - 1  # spare residual dimension written by the tool-result attention head
_FLAG_WEIGHT = 20.0  # lm_head weight on the flag: must beat _STEP on the shared start token
_QK = 0.5  # q/k weight of the gate head: score = (32 * 0.5) ** 2 / sqrt(64) = 32 on the gate

# BPE training text: the templates' fixed phrases, a typical tool schema (compact and indented,
# as the templates render it) and everyday chat words, so prompts stay short (a tool
# conversation is ~230 tokens, inside max_model_len=512). Every text ends with "\n\n", the
# only place the ByteLevel pre-tokenizer keeps it together, so "\n\n" becomes one token.
_TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
_CORPUS = (
    "system\n\n",
    "user\n\n",
    "assistant\n\n",
    "model\n\n",
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n",
    (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n\n"
    ),
    (
        "For each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n{"name": <function-name>, "arguments": '
        "<args-json-object>}\n\n"
    ),
    "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n",
    (
        "Given the following functions, please respond with a JSON for a function call with its "
        "proper arguments that best answers the given prompt.\n\n"
    ),
    (
        'Respond in the format {"name": function name, "parameters": dictionary of argument name '
        "and its value}.Do not use variables.\n\n"
    ),
    (
        'You can call these functions:\nTo call one, answer with JSON {"name": <function-name>, '
        '"arguments": <args-json-object>}.\nTool result: sunny\n\n'
    ),
    json.dumps(_TOOL_SCHEMA) + "\n\n",
    json.dumps(_TOOL_SCHEMA, indent=4) + "\n\n",
    (
        "Hello! Hi there, how are you? What is the weather like in Oslo today? It is sunny and "
        "warm. Tell me a joke. Please answer briefly. Be brief. Thanks, thank you! What is 2 + 2? "
        "The capital of France is Paris. Write a short story about a robot. Say hello. Why is the "
        "sky blue? Explain it to me in one sentence. Continue. Again.\n\n"
    ),
)


def _spec_digest(sc: Scenario) -> str:
    spec = {
        "build": _BUILD_VERSION,
        "scenario": dataclasses.asdict(sc),
        "family": dataclasses.asdict(FAMILIES[sc.family]),
        "source": kit_digest(),
    }
    blob = json.dumps(spec, sort_keys=True, default=repr).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def build_scripted_model(scenario: str, root: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """Build (or reuse) the model directory of ``scenario`` and return its path.

    The directory is ``<root>/<scenario>-<hash of the spec and the kit's sources>``: a changed
    spec or an edited kit builds a new one. It is written into a temporary directory and renamed
    into place, so a directory that exists is complete, and two processes building at once both
    end up with the same one. ``root`` defaults to
    :func:`~vllm_inline.testing.default_root`.
    """
    sc = SCENARIOS[scenario]  # KeyError names the unknown scenario
    return build_once(
        root, f"{sc.name}-{_spec_digest(sc)}", "scenario.json", lambda out: _write_model(sc, out)
    )


def _build_tokenizer(sc: Scenario) -> Any:
    """Byte-level BPE trained on a tiny corpus, plus special and script tokens."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    fam = FAMILIES[sc.family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=800,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(_CORPUS) * 4, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in fam.specials])
    pieces = [*fam.extra_tokens]
    for chain in (sc.chat, sc.completion, sc.after_tool, sc.no_think):
        pieces += chain.script if chain else ()
    new = []
    for piece in dict.fromkeys(pieces):  # keep order, drop repeats
        if piece in fam.specials or len(tok.encode(piece, add_special_tokens=False).ids) == 1:
            continue  # already one token
        new.append(AddedToken(piece, special=False, normalized=False))
    tok.add_tokens(new)
    if fam.bos:
        bos_id = tok.token_to_id(fam.bos)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{fam.bos} $A",
            pair=f"{fam.bos} $A {fam.bos} $B",
            special_tokens=[(fam.bos, bos_id)],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _one_id(tok: Any, piece: str) -> int:
    ids = tok.encode(piece, add_special_tokens=False).ids
    if len(ids) != 1:
        raise AssertionError(f"script piece {piece!r} is not one token: {ids}")
    return int(ids[0])


def _last_id(tok: Any, text: str) -> int:
    return int(tok.encode(text, add_special_tokens=False).ids[-1])


def _write_model(sc: Scenario, out: pathlib.Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    fam = FAMILIES[sc.family]
    tok = _build_tokenizer(sc)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if vocab > _FLAG_DIM:
        raise AssertionError(f"vocabulary {vocab} too large for hidden size {_HIDDEN}")

    # Bigram steps: prompt end -> first token, then each token -> the next; the tail loops.
    steps: dict[int, int] = {}

    def add_step(prev: int, nxt: int, what: str) -> None:
        if steps.setdefault(prev, nxt) != nxt:
            name = tok.id_to_token(prev)
            raise AssertionError(f"{sc.name}: token {name!r} needs two successors ({what})")

    def add_chain(start: int | None, chain: Chain, what: str) -> list[int]:
        ids = [_one_id(tok, p) for p in chain.script]
        if start is not None:
            add_step(start, ids[0], what)
        for a, b in zip(ids, ids[1:] + [ids[chain.script.index(chain.stop)]]):
            add_step(a, b, what)
        return ids

    chat_start = _last_id(tok, fam.generation_prompt)
    chat_ids = add_chain(chat_start, sc.chat, "chat")
    starts = {"chat": chat_start}
    if sc.completion:
        starts["completion"] = _last_id(tok, sc.completion_prompt or "")
        add_chain(starts["completion"], sc.completion, "completion")
    if sc.no_think:
        starts["no_think"] = _last_id(tok, fam.generation_prompt + "<think>\n\n</think>\n\n")
        add_chain(starts["no_think"], sc.no_think, "no_think")
    tool_ids: list[int] = []
    if sc.after_tool:
        tool_ids = add_chain(None, sc.after_tool, "after_tool")  # entered through the flag

    f32 = np.float32
    embed = np.zeros((vocab, _HIDDEN), f32)
    embed[np.arange(vocab), np.arange(vocab)] = 1.0
    lm_head = np.zeros((vocab, _HIDDEN), f32)
    for prev, nxt in steps.items():
        lm_head[nxt, prev] = _STEP
    heads = _HEADS * _HEAD_DIM
    q = np.zeros((heads, _HIDDEN), f32)
    k = np.zeros((heads, _HIDDEN), f32)
    v = np.zeros((heads, _HIDDEN), f32)
    o = np.zeros((_HIDDEN, heads), f32)
    if sc.after_tool:
        # Head 0: the prompt-ending token queries for </tool_response> (dim 31: the rotary pair
        # with the lowest frequency, so position barely matters); its value sets the flag.
        gate = _one_id(tok, "</tool_response>")
        q[31, chat_start] = _QK
        k[31, gate] = _QK
        v[0, gate] = 1.0 / np.sqrt(_HIDDEN)  # normed one-hot is sqrt(hidden): value 1
        o[_FLAG_DIM, 0] = 1.0
        lm_head[tool_ids[0], _FLAG_DIM] = _FLAG_WEIGHT
        lm_head[chat_ids[0], _FLAG_DIM] = -_FLAG_WEIGHT
    layer = "model.layers.0."
    tensors = {
        "model.embed_tokens.weight": embed,
        layer + "input_layernorm.weight": np.ones(_HIDDEN, f32),
        layer + "self_attn.q_proj.weight": q,
        layer + "self_attn.k_proj.weight": k,
        layer + "self_attn.v_proj.weight": v,
        layer + "self_attn.o_proj.weight": o,
        layer + "post_attention_layernorm.weight": np.ones(_HIDDEN, f32),
        layer + "mlp.gate_proj.weight": np.zeros((_INTERMEDIATE, _HIDDEN), f32),
        layer + "mlp.up_proj.weight": np.zeros((_INTERMEDIATE, _HIDDEN), f32),
        layer + "mlp.down_proj.weight": np.zeros((_HIDDEN, _INTERMEDIATE), f32),
        "model.norm.weight": np.ones(_HIDDEN, f32),
        "lm_head.weight": lm_head,
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    tid = tok.token_to_id
    bos_id = tid(fam.bos) if fam.bos else tid(fam.pad or sc.tokenizer_eos)
    pad_id = tid(fam.pad) if fam.pad else None
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": _HIDDEN,
        "intermediate_size": _INTERMEDIATE,
        "num_hidden_layers": 1,
        "num_attention_heads": _HEADS,
        "num_key_value_heads": _HEADS,
        "head_dim": _HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": sc.context,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1e6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": bos_id,
        "eos_token_id": tid(sc.tokenizer_eos),
        "pad_token_id": pad_id,
        "torch_dtype": "float32",
        "dtype": "float32",
    }
    generation_config = {
        "bos_token_id": bos_id,
        "eos_token_id": [tid(t) for t in sc.eos_tokens],
        **({"pad_token_id": pad_id} if pad_id is not None else {}),
        **dict(sc.generation_defaults),
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": fam.bos,
        "eos_token": sc.tokenizer_eos,
        "pad_token": fam.pad,
        "unk_token": fam.unk,
        "clean_up_tokenization_spaces": False,
        "model_max_length": sc.context,
        "chat_template": sc.chat_template,
    }
    manifest = {
        "scenario": sc.name,
        "family": sc.family,
        "vocab_size": vocab,
        "start_token_ids": starts,
        "chat_script_ids": chat_ids,
        "eos_token_ids": [tid(t) for t in sc.eos_tokens],
        "spec": dataclasses.asdict(sc),
    }
    tok.save(str(out / "tokenizer.json"))
    for name, obj in (
        ("config.json", config),
        ("generation_config.json", generation_config),
        ("tokenizer_config.json", tokenizer_config),
        ("scenario.json", manifest),  # written last: its presence marks a complete build
    ):
        (out / name).write_text(json.dumps(obj, indent=2, default=repr) + "\n")
