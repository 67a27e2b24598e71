"""Agent clients nobody here wrote, against the server (make test-agents installs them from the
npm registry under build/agents), each answer equal to the engine's own:

- OpenAI's Codex CLI runs ``codex exec`` with a custom provider on the Responses wire, in a
  temporary ``CODEX_HOME``, against the server on the demo model (scripted; its context holds
  Codex's prompt of about 22k tokens). Codex sends its function tools and its hosted ones: the
  server serves them as ``vllm serve`` does (no tool parser asked for: the model's text comes
  back as text). The requests Codex sent are read back from the server, to say what was tested.
- The Vercel AI SDK (``@ai-sdk/openai``: Responses and chat, ``generateText`` and
  ``streamText``) and OpenAI's Agents SDK for JavaScript (``@openai/agents``: a plain run, a
  streamed run, a run that calls a function tool on the ``chatml_tools`` model, served with
  ``hermes``), from tests/js_clients.mjs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serving import serving

from vllm_inline.engine import get_engine, start_engines
from vllm_inline.server import OpenAIServer
from vllm_inline.server.responses import MemoryResponseStore
from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS, SCENARIOS, build_scripted_model

pytestmark = pytest.mark.agents

AGENTS = Path(__file__).resolve().parents[1] / "build" / "agents"
"""Where ``make test-agents`` installs the JavaScript clients (its ``node_modules``)."""
CODEX = AGENTS / "node_modules" / ".bin" / "codex"


class Recorded:
    """The Responses requests' bodies, kept by a middleware of the app under test."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []


@pytest.fixture(scope="module")
def server(scripted: Any) -> Iterator[tuple[str, Recorded]]:
    from fastapi import FastAPI, Request

    if not CODEX.exists():
        pytest.fail(f"{CODEX} is missing: run `make test-agents`, which installs it")
    model = str(build_scripted_model("demo"))
    options = {**CPU_TEST_ENGINE_KWARGS, "max_model_len": 32768, "kv_cache_memory_bytes": 2**29}
    engine = get_engine(model, **options)
    recorded = Recorded()
    tools = scripted("chatml_tools").engine
    start_engines(tools)  # the suite's shared engine: not the lifespan's to stop
    served = OpenAIServer(
        {"demo": engine, "tools": tools},
        tool_parser={"tools": "hermes"},
        enable_auto_tool_choice=True,
        responses_store=MemoryResponseStore(),
    )
    app = FastAPI(lifespan=served.lifespan)

    @app.middleware("http")
    async def keep(request: Request, call_next: Any) -> Any:
        if request.url.path == "/v1/responses":
            recorded.bodies.append(json.loads(await request.body()))
        return await call_next(request)

    served.install(app)
    try:
        with serving(app) as url:
            yield url, recorded
    finally:
        engine.shutdown()


def test_codex_exec_answers_with_the_engine_s_answer(
    server: tuple[str, Recorded], tmp_path: Path
) -> None:
    url, recorded = server
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "demo"\nmodel_provider = "inline"\n\n[model_providers.inline]\n'
        f'name = "vllm-inline"\nbase_url = "{url}/v1"\nwire_api = "responses"\n'
    )
    env = {**os.environ, "CODEX_HOME": str(home), "NO_COLOR": "1"}
    start = len(recorded.bodies)
    done = subprocess.run(
        [str(CODEX), "exec", "--skip-git-repo-check", "--json", "Say hi"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    messages = [
        e["item"]["text"]
        for e in events
        if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"
    ]
    assert messages == [SCENARIOS["demo"].answer]
    (body,) = recorded.bodies[start:]
    kinds = sorted({tool["type"] for tool in body["tools"]})
    print(f"codex sent {len(body['tools'])} tools of types {kinds}, stream={body.get('stream')}")
    assert "function" in kinds and body.get("stream") is True


def test_the_ai_sdk_and_the_agents_sdk_get_the_engine_s_answers(
    server: tuple[str, Recorded],
) -> None:
    url, _ = server
    script = AGENTS / "js_clients.mjs"  # beside node_modules, where its imports resolve
    shutil.copyfile(Path(__file__).with_name("js_clients.mjs"), script)
    done = subprocess.run(
        ["node", str(script), f"{url}/v1", "demo", "tools"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.splitlines()[-1])
    demo = SCENARIOS["demo"].answer
    after_tool = SCENARIOS["chatml_tools"].after_tool
    assert after_tool is not None
    weather = after_tool.answer
    assert answers == {
        "ai-sdk responses generateText": {"text": demo},
        "ai-sdk responses streamText": {
            "text": demo,
            "chunks": answers["ai-sdk responses streamText"]["chunks"],
        },
        "ai-sdk chat generateText": {"text": demo},
        "ai-sdk chat streamText": {
            "text": demo,
            "chunks": answers["ai-sdk chat streamText"]["chunks"],
        },
        "agents run": {"text": demo},
        "agents run streamed": {"text": demo, "chunks": answers["agents run streamed"]["chunks"]},
        "agents run with a tool": {"text": weather, "calls": ["Oslo"]},
    }
    assert all(v.get("chunks", 2) > 1 for v in answers.values())  # streamed in pieces
