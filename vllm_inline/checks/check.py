"""``python -m vllm_inline check --model PATH_OR_ID``: does vllm-inline run this model right?

One table, exit code 0 (no row failed) or 1; the rows are explained in ``docs/models.md``: what
was chosen (engine options, template, stop tokens, sampling defaults, parsers, context window),
the rendered multi-turn prompt and what the template refuses, greedy parity with
``transformers`` (only a different first token fails), no special-token text and a stop at the
end-of-turn token, and a tool-call round trip when the template takes tools (never failed).
Everything goes through the public :class:`~vllm_inline.engine.Engine` API.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from vllm_inline.engine import Engine, get_engine
from vllm_inline.engine.errors import VLLMInlineError
from vllm_inline.engine.life.templates import detect_family
from vllm_inline.engine.request.sampling import DEFAULTS
from vllm_inline.engine.seam.versions import installed_vllm, range_text, support_status
from vllm_inline.engine.stream.parsing import DEFAULT_TOOL_PARSERS

from .parity import add_parity_rows
from .report import Report, Row, shorten
from .tools import add_tool_rows, rendered

__all__ = ["CONVERSATION", "Report", "Row", "run_check"]

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]
"""The multi-turn conversation the check renders and answers."""

_MARKER = "vllm-inline-check-marker"


def _generation_config_eos(model: str) -> list[int]:
    try:
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(model).eos_token_id
    except Exception:  # noqa: BLE001 - no generation_config.json is a finding, not an error
        return []
    return [eos] if isinstance(eos, int) else list(eos or [])


def _chosen(engine: Engine, report: Report, tool_parser: str | None) -> dict[str, Any]:
    """The engine's decisions; returns facts the later rows need."""
    defaults = engine.platform_defaults
    report.add("engine options", "info", defaults.summary() if defaults else "n/a")
    policy = engine.stop_policy
    tok = engine.tokenizer
    vocab = tok.get_vocab()
    family = detect_family(vocab)
    source = policy.template_source
    if source == "none":
        report.add(
            "chat template",
            "fail",
            "none",
            "The tokenizer has no chat template and the family has no fallback: pass "
            "chat_template='<jinja or path>'.",
        )
    else:
        report.add("chat template", "ok", source, f"family: {policy.family or 'not recognised'}")
    gen_eos = _generation_config_eos(engine.model)
    parts = []
    for token_id, token in zip(policy.stop_token_ids, policy.stop_tokens):
        where = []
        if token_id == tok.eos_token_id:
            where.append("tokenizer eos")
        if token_id in gen_eos:
            where.append("generation_config")
        if family is not None and token in family.end_of_turn:
            where.append(f"family {family.name}")
        parts.append(f"{token} (id {token_id}: {', '.join(where) or '?'})")
    report.add(
        "stop tokens",
        "ok" if parts else "fail",
        "; ".join(parts) or "none",
        "" if parts else "No end-of-sequence token at all: generation runs to max_tokens.",
    )
    sampling = engine.default_sampling
    from_model = sorted(k for k in sampling if k not in DEFAULTS or sampling[k] != DEFAULTS[k])
    report.add(
        "sampling defaults",
        "info",
        json.dumps(sampling, sort_keys=True),
        f"from generation_config: {', '.join(from_model) or 'nothing'}; vllm-inline's own: "
        f"{json.dumps(dict(DEFAULTS), sort_keys=True)}",
    )
    parser = tool_parser or DEFAULT_TOOL_PARSERS.get(policy.family or "")
    report.add(
        "tool parser",
        "info",
        parser or "none",
        "given with --tool-parser"
        if tool_parser
        else (
            f"the default for family {policy.family}"
            if parser
            else "no default for this family: pass tool_parser='<name>' to use tools"
        ),
    )
    thinks = "<think>" in vocab and "</think>" in vocab
    report.add(
        "reasoning parser",
        "info",
        "none chosen automatically",
        "The vocabulary has <think>/</think>: pass reasoning_parser='qwen3' (or "
        "'deepseek_r1') so thinking stays out of content."
        if thinks
        else "No <think> tokens in the vocabulary.",
    )
    lowered = [c for c in (defaults.chosen if defaults else ()) if c.name == "max_model_len"]
    report.add(
        "context window",
        "info",
        f"{engine.max_model_len} tokens",
        f"lowered: {lowered[0].reason}" if lowered else "",
    )
    return {"tool_parser": parser, "gen_eos": gen_eos}


def _end_of_turn(engine: Engine) -> tuple[int | None, str | None]:
    """The token the template puts right after an assistant message's content."""
    tok = engine.tokenizer
    ids, _ = rendered(
        engine, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _MARKER}]
    )
    if ids is None:
        return None, None
    text = tok.decode(ids, skip_special_tokens=False)
    if _MARKER not in text:
        return None, None
    rest = text[text.index(_MARKER) + len(_MARKER) :].lstrip()
    added = sorted(tok.get_added_vocab().items(), key=lambda kv: -len(kv[0]))
    for token, token_id in added:
        if rest.startswith(token):
            return token_id, token
    return None, None


def _template(
    engine: Engine, report: Report, gen_eos: list[int]
) -> tuple[list[dict[str, Any]], int | None]:
    """Rendered prompt, role rules and the end-of-turn token; returns the conversation the
    template accepts and the end-of-turn token id."""
    conversation = CONVERSATION
    ids, error = rendered(engine, conversation)
    if ids is None:
        conversation = CONVERSATION[1:]
        ids, error_no_system = rendered(engine, conversation)
        if ids is None:
            report.add(
                "rendered prompt", "fail", "the template refuses the conversation", error_no_system
            )
            return conversation, None
        report.add(
            "system role",
            "warn",
            "refused by the template",
            f"{error}\nLangChain and LlamaIndex send system messages: merge them into the "
            "first user turn or pass a chat_template that takes them.",
        )
    else:
        report.add("system role", "ok", "accepted")
    report.add("rendered prompt", "ok", f"{len(ids)} tokens (shown below)")
    report.blocks["rendered prompt (system, user, assistant, user)"] = engine.tokenizer.decode(
        ids, skip_special_tokens=False
    )
    two_users = [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Hello?"}]
    same, error = rendered(engine, two_users)
    report.add(
        "non-alternating turns",
        "info",
        "accepted" if same is not None else "refused",
        "" if same is not None else error,
    )
    eot_id, eot = _end_of_turn(engine)
    policy = engine.stop_policy
    if eot_id is None:
        report.add(
            "end of turn",
            "warn",
            "not found",
            "No special token follows an assistant message in the rendered template.",
        )
    elif eot_id not in policy.stop_token_ids:
        report.add(
            "end of turn",
            "fail",
            f"{eot} (id {eot_id}) is not a stop token",
            f"The template ends an assistant turn with {eot}, but generation_config.json's "
            f"eos_token_id is {gen_eos} and the tokenizer's EOS is "
            f"{getattr(engine.tokenizer, 'eos_token', None)!r}: answers run past the end of the turn. Add "
            f"{eot_id} to eos_token_id in generation_config.json.",
        )
    elif eot_id not in gen_eos:
        report.add(
            "end of turn",
            "warn",
            f"{eot} (id {eot_id}), not in generation_config",
            f"vllm-inline stops there (tokenizer EOS or family {policy.family}); other "
            f"runtimes read generation_config.json's eos_token_id {gen_eos} and will not.",
        )
    else:
        report.add("end of turn", "ok", f"{eot} (id {eot_id}), in generation_config")
    return conversation, eot_id


def _answer(
    engine: Engine, report: Report, conversation: list[dict[str, Any]], eot_id: int | None
) -> None:
    """One greedy answer: no special-token text, stops at the end-of-turn token."""
    tok = engine.tokenizer
    text: list[str] = []
    ids: list[int] = []
    last = None
    for delta in engine.stream(conversation, temperature=0.0, max_tokens=256):
        text.append(delta.text)
        ids.extend(delta.token_ids)
        last = delta
    answer = "".join(text)
    specials = {t for t in tok.all_special_tokens if t}
    # Added tokens marked special (skip_special_tokens hides them); plain added tokens such as
    # Qwen's <tool_call> are text the model may legitimately write.
    decoder = getattr(tok, "added_tokens_decoder", {}) or {}
    specials |= {str(t) for t in decoder.values() if getattr(t, "special", False) and str(t)}
    leaked = sorted(t for t in specials if t in answer)
    if leaked:
        report.add(
            "special tokens in content",
            "fail",
            ", ".join(leaked),
            f"The answer's text shows special tokens: {shorten(answer, 160)}",
        )
    else:
        report.add("special tokens in content", "ok", "none", f"answer: {shorten(answer, 160)}")
    finish = last.finish_reason if last else None
    stopped_at = (
        last.stop_reason
        if last and isinstance(last.stop_reason, int)
        else (ids[-1] if ids else None)
    )
    shown = tok.convert_ids_to_tokens([stopped_at])[0] if stopped_at is not None else None
    if finish != "stop":
        report.add(
            "stops at end of turn",
            "warn",
            f"finish_reason={finish} after {len(ids)} tokens",
            "The greedy answer did not end within 256 tokens (a small model may ramble).",
        )
    elif eot_id is not None and stopped_at != eot_id:
        report.add(
            "stops at end of turn",
            "warn",
            f"stopped at {shown}",
            "Not the template's end-of-turn token (see 'end of turn').",
        )
    else:
        report.add("stops at end of turn", "ok", f"finish_reason=stop at {shown}")


def _vllm_row(report: Report) -> None:
    """Which vLLM is installed, and whether vllm-inline was run on it, checked against its
    sources, or neither (docs/compatibility.md)."""
    found = installed_vllm()
    if found is None:
        report.add("vllm", "fail", "not installed", "pip install 'vllm-inline[gpu]' or '[cpu]'.")
        return
    dist, version = found
    status = support_status(version)
    detail = (
        ""
        if status != "unknown"
        else (
            f"Outside the supported range ({range_text()}): it may work; if something breaks, "
            "install a release in that range (docs/compatibility.md)."
        )
    )
    level = "warn" if status == "unknown" else "info"
    report.add("vllm", level, f"{dist} {version}: {status}", detail)


def run_check(
    model: str,
    *,
    vllm_kwargs: Mapping[str, Any] | None = None,
    tool_parser: str | None = None,
    max_tokens: int = 48,
    trust_remote_code: bool = False,
) -> Report:
    """Check ``model`` on a real engine (started with ``vllm_kwargs``, else the engine's own
    choice) and return the :class:`Report`; ``report.passed`` is the exit status."""
    report = Report(model)
    _vllm_row(report)
    try:
        engine = get_engine(model, **dict(vllm_kwargs or {})).start()
    except VLLMInlineError as e:
        report.add("engine start", "fail", type(e).__name__, str(e))
        return report
    report.add("engine start", "ok", "started")

    def step(name: str, run: Any, fallback: Any) -> Any:
        # One broken step is a failed row; the rows after it still run.
        try:
            return run()
        except Exception as e:  # noqa: BLE001
            report.add(name, "fail", type(e).__name__, str(e))
            return fallback

    chosen = step(
        "chosen",
        lambda: _chosen(engine, report, tool_parser),
        {"tool_parser": tool_parser, "gen_eos": []},
    )
    conversation, eot_id = step(
        "template", lambda: _template(engine, report, chosen["gen_eos"]), (CONVERSATION, None)
    )
    step("answer", lambda: _answer(engine, report, conversation, eot_id), None)
    step(
        "parity",
        lambda: add_parity_rows(engine, report, conversation, max_tokens, trust_remote_code),
        None,
    )
    step("tools", lambda: add_tool_rows(engine, report, chosen["tool_parser"]), None)
    return report
