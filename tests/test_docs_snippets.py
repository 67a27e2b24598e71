"""The README's and docs/quickstart.md's snippets run as written, each as a script of its own, and
print what they print and nothing else (issue 63): no ERROR or traceback of vLLM's at exit, no
line of ours, vLLM's weight-loading progress only on stderr.

The code blocks are read from the files, so an edit to the docs is what is tested; the one
change is the model: ``"Qwen/Qwen3-0.6B"`` (a hub id; no hub here) becomes the scripted Qwen3
model with reasoning (``chatml_reasoning``), whose answer is known. The snippets run with the
engine's own options, as a user's would: none of the test kit's.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from launches import Command, Launches, command

from vllm_inline.testing import SCENARIOS, build_scripted_model

ROOT = Path(__file__).resolve().parents[1]
HUB_MODEL = '"Qwen/Qwen3-0.6B"'
PROGRESS = "Loading safetensors checkpoint shards"
SCENARIO = SCENARIOS["chatml_reasoning"]
SNIPPETS = {
    "readme-langchain": ("README.md", "LangChain"),
    "readme-llama-index": ("README.md", "LlamaIndex"),
    "quickstart-langchain": ("docs/quickstart.md", "LangChain"),
    "quickstart-llama-index": ("docs/quickstart.md", "LlamaIndex"),
    "quickstart-engine": ("docs/quickstart.md", "The engine directly"),
}
"""Launch name -> (file, the ``## `` section whose one Python block it runs)."""


def snippet(path: str, section: str) -> str:
    """The one ``python`` code block of ``section`` (a ``## `` heading) in ``path``."""
    text = (ROOT / path).read_text()
    parts = re.split(r"^## ", text, flags=re.MULTILINE)
    bodies = [p for p in parts[1:] if p.splitlines()[0].strip() == section]
    assert len(bodies) == 1, f"{path} has {len(bodies)} sections '## {section}'"
    blocks = re.findall(r"^```python\n(.*?)^```", bodies[0], flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, f"{path} '## {section}' has {len(blocks)} python blocks"
    assert HUB_MODEL in blocks[0], f"{path} '## {section}' no longer names {HUB_MODEL}"
    return blocks[0]


def _factory(name: str, path: str, section: str) -> None:
    @command(name)
    def run(directory: Path) -> Command:
        model = build_scripted_model("chatml_reasoning", directory / "models")
        script = directory / f"{name}.py"
        script.write_text(snippet(path, section).replace(HUB_MODEL, repr(str(model))))
        env = {**os.environ, "VLLMINLINE_CACHE": str(directory / "cache")}
        for variable in ("VLLM_LOGGING_LEVEL", "TORCH_CPP_LOG_LEVEL", "PYTHONWARNINGS"):
            env.pop(variable, None)
        return Command([sys.executable, str(script)], env, cwd=directory)


for _name, (_path, _section) in SNIPPETS.items():
    _factory(_name, _path, _section)


def prompt_tokens(text: str) -> int:
    """The prompt a chat turn of ``text`` renders to with the model's own template, in tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(build_scripted_model("chatml_reasoning"))
    messages = [{"role": "user", "content": text}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(tokenizer(prompt, add_special_tokens=False)["input_ids"])


ANSWER = SCENARIO.chat.answer  # "<think>\nNeed to think\n</think>\n\nThe answer is 42."
CONTENT = ANSWER.partition("</think>")[2]  # what the qwen3 reasoning parser leaves as content
OUTPUT_TOKENS = SCENARIO.chat.script.index(SCENARIO.chat.stop) + 1  # the end token counts


def expected_stdout(name: str) -> str:
    """What the snippet prints, whole."""
    if name in ("readme-langchain", "readme-llama-index"):
        return CONTENT
    moons = prompt_tokens("Name three moons of Jupiter.")
    if name == "quickstart-langchain":
        usage = {
            "input_tokens": moons,
            "output_tokens": OUTPUT_TOKENS,
            "total_tokens": moons + OUTPUT_TOKENS,
            "input_token_details": {"cache_read": 0},
        }
        return f"{CONTENT}{CONTENT} {usage} stop\n"
    if name == "quickstart-llama-index":
        sky = prompt_tokens("Why is the sky blue?")
        kwargs = {
            "prompt_tokens": sky,
            "completion_tokens": OUTPUT_TOKENS,
            "total_tokens": sky + OUTPUT_TOKENS,
            "cached_tokens": 0,
            "finish_reason": "stop",
        }
        return f"{ANSWER}{kwargs}\n{ANSWER}\n"
    hi = prompt_tokens("Hi")
    usage = f"Usage(prompt_tokens={hi}, completion_tokens={OUTPUT_TOKENS}, cached_tokens=0)"
    return f"{ANSWER}\n stop {usage}\n"


@pytest.mark.engine
@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=pytest.mark.launches(name)) for name in SNIPPETS]
)
def test_a_docs_snippet_prints_its_answer_and_nothing_else(launches: Launches, name: str) -> None:
    result = launches.result(name)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == expected_stdout(name), result.stdout[-3000:]
    lines = [line.strip() for line in re.split(r"[\r\n]", result.stderr) if line.strip()]
    assert lines, "vLLM's weight-loading progress is expected on stderr"
    assert all(line.startswith(PROGRESS) for line in lines), result.stderr[-3000:]
