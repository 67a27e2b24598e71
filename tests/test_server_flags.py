"""``vllm serve``'s command line on ``python -m vllm_inline serve`` (vllm_inline.commands.serve_flags):
every option of the installed vLLM's parser has a meaning here or a reason to be refused, and
docs/server.md's table is generated from that parser (a new option fails here until it is
listed); options read by vLLM's own parser in a child process (argparse's error for a misspelled
one); adapters served as models and the server's chat template, on real engines."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving import serving

from vllm_inline.commands import serve, serve_flags

DOCS = Path(__file__).resolve().parents[1] / "docs" / "server.md"
START, END = "<!-- vllm-serve-options: start -->", "<!-- vllm-serve-options: end -->"


def own_flags() -> set[str]:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return {flag for action in parser._actions for flag in action.option_strings}


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args, extra = parser.parse_known_args(list(argv))
    assert not extra
    return args


def test_every_server_option_of_vllm_serve_has_a_meaning_or_a_reason() -> None:
    from vllm_inline.engine.seam.vllm_cli import options

    own = own_flags()
    server = {
        dest for dest, flags, is_engine in options() if not is_engine and not own & set(flags)
    }
    assert server - set(serve_flags.TAKEN) - set(serve_flags.REFUSED) == set()
    assert set(serve_flags.TAKEN) & set(serve_flags.REFUSED) == set()


def test_the_docs_table_is_vllm_s_parser_s() -> None:
    from vllm_inline.engine.seam.versions import installed_vllm
    from vllm_inline.engine.seam.vllm_cli import options

    version = (installed_vllm() or ("vllm", "?"))[1]
    text = DOCS.read_text()
    documented = text[text.index(START) + len(START) : text.index(END)].strip()
    if f"vLLM {version}'s" not in documented:
        pytest.skip(f"docs/server.md's table is of another vLLM than {version} (the pinned one's)")
    generated = serve_flags.table(options(), own_flags(), version)
    assert documented == generated, "regenerate docs/server.md's table: " + generated


def test_engine_options_go_to_the_engine_under_vllm_kwargs() -> None:
    args = serve_args("--vllm-kwargs", '{"max_model_len": 512}')
    given = {"engine": {"max_model_len": 4096, "tensor_parallel_size": 2,
                        "served_model_name": ["q"]},
             "server": {"api_server_count": 2, "uvicorn_log_level": "debug"}}  # fmt: skip
    assert serve_flags.apply(args, given) is None
    assert args.vllm_kwargs == {"max_model_len": 512, "tensor_parallel_size": 2}
    assert (args.served_model_name, args.workers) == ("q", 2)
    assert args.uvicorn == {"log_level": "debug"} and args.lora_modules == {}


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"grpc": True}, "--grpc is not served here: vLLM's gRPC server"),
        ({"lora_modules": [{"name": "a", "path": "/no/such"}]}, "--lora-modules a=/no/such"),
        ({"brand_new_option": 1}, "--brand-new-option is not known to vllm-inline"),
        ({"model_tag": "b"}, "'b' is not an option's value here: give the model first"),
    ],
)
def test_a_server_option_without_a_meaning_here_is_refused_naming_it(
    server: dict[str, Any], message: str
) -> None:
    assert message in (serve_flags.apply(serve_args(), {"server": server}) or "")


def test_lora_modules_need_enable_lora(tmp_path: Path) -> None:
    given = {"server": {"lora_modules": [{"name": "a", "path": str(tmp_path)}]}}
    assert "--enable-lora" in (serve_flags.apply(serve_args(), given) or "")


def test_vllm_s_parser_reads_the_options_in_a_child(capsys: pytest.CaptureFixture[str]) -> None:
    """The launcher imports no vLLM: the child does, and its argparse error ends the command."""
    args = serve_args("my/model")
    assert serve.argument_problem(args, ["--max-model-len", "4k", "-tp", "2"]) is None
    assert args.vllm_kwargs == {"max_model_len": 4000, "tensor_parallel_size": 2}
    assert args.model == "my/model"
    with pytest.raises(SystemExit) as raised:
        serve.argument_problem(serve_args(), ["--max-model-lenn", "5"])
    assert raised.value.code == 2
    assert "unrecognized arguments: --max-model-lenn" in capsys.readouterr().err


def test_a_chat_template_that_does_not_parse_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "t.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }}")
    args = serve_args()
    problem = serve.argument_problem(args) or ""  # no vLLM option: no child
    assert problem == ""
    args.chat_template = str(bad)
    with pytest.raises(ValueError, match="does not parse"):
        serve.chat_template_text(str(bad))
    with pytest.raises(ValueError, match="no such file"):
        serve.chat_template_text(str(tmp_path / "missing.jinja"))
    assert serve.chat_template_text("{{ messages[0].content }}") == "{{ messages[0].content }}"


@pytest.mark.engine
def test_lora_modules_and_chat_template_on_the_server(scripted: Any, tmp_path: Path) -> None:
    """As vllm serve --lora-modules: each adapter a model (the engine's answer with the adapter),
    listed in /v1/models with its parent and its directory as root; --chat-template: the
    template of requests that send none, /tokenize included."""
    from fastapi import FastAPI
    from test_lora import BASE, LORA_KWARGS, MESSAGES, PARIS, write_lm_head_adapter

    from vllm_inline.engine import get_engine
    from vllm_inline.server import OpenAIServer
    from vllm_inline.server.responses import MemoryResponseStore

    model = scripted("llama3").path
    script = ("The", " capital", " of", " France", " is", " Paris", ".", "<|eot_id|>")
    # A name of its own: the engine is test_lora.py's too, whose adapters keep their names.
    paris = write_lm_head_adapter(Path(model), tmp_path / "paris", script)
    engine = get_engine(model, **LORA_KWARGS)
    own = json.loads((Path(model) / "tokenizer_config.json").read_text())["chat_template"]
    template = "From the server's template. " + own  # the same answers, a prompt told apart
    server = OpenAIServer(
        chat={"base": engine},
        lora_modules={"served-paris": paris},
        chat_template=template,
        responses_store=MemoryResponseStore(),
    )
    app = FastAPI(lifespan=server.lifespan)  # starts the engine, and stops it
    server.install(app)
    with serving(app) as url:
        cards = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
        assert [(c["id"], c["root"], c["parent"]) for c in cards] == [
            ("base", model, None), ("served-paris", paris, "base")
        ]  # fmt: skip
        tokens = httpx.post(f"{url}/tokenize", json={"messages": MESSAGES}, timeout=30).json()
        assert "From the server's template." in engine.tokenizer.decode(tokens["tokens"])
        for name, text in (("base", BASE), ("served-paris", PARIS), ("base", BASE)):
            body = {"model": name, "messages": MESSAGES, "temperature": 0}
            answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
            assert answer.get("model") == name, answer
            assert answer["choices"][0]["message"]["content"] == text
    assert not engine.started
