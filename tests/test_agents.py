"""Agent clients nobody here wrote, against the server (make test-agents): OpenAI's Codex CLI
(npm ``@openai/codex``, installed by the target under build/agents) runs ``codex exec`` with a
custom provider on the Responses wire, in a temporary ``CODEX_HOME``, against the server on the
demo model (scripted; its context holds Codex's prompt of about 22k tokens). Codex sends its
function tools and its hosted ones: the server serves them as ``vllm serve`` does (no tool
parser asked for: the model's text comes back as text), and Codex's final message is the
engine's own answer. The requests Codex sent are read back from the server, to say what was
tested."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serving import serving

from vllm_inline.engine import get_engine
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
def server() -> Iterator[tuple[str, Recorded]]:
    from fastapi import FastAPI, Request

    if not CODEX.exists():
        pytest.fail(f"{CODEX} is missing: run `make test-agents`, which installs it")
    model = str(build_scripted_model("demo"))
    options = {**CPU_TEST_ENGINE_KWARGS, "max_model_len": 32768, "kv_cache_memory_bytes": 2**29}
    engine = get_engine(model, **options)
    recorded = Recorded()
    served = OpenAIServer({"demo": engine}, responses_store=MemoryResponseStore())
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
    (body,) = recorded.bodies
    kinds = sorted({tool["type"] for tool in body["tools"]})
    print(f"codex sent {len(body['tools'])} tools of types {kinds}, stream={body.get('stream')}")
    assert "function" in kinds and body.get("stream") is True
