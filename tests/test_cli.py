"""``python -m vllm_inline demo|chat`` end to end, each in its own process on the embedded model."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from launches import Command, Launches, command

from vllm_inline.testing import SCENARIOS

ANSWER = SCENARIOS["demo"].answer
SUMMARY = re.compile(
    r"\[finish_reason=stop prompt_tokens=\d+ completion_tokens=(\d+) time_to_first_token=\d+ ms\]"
)


def cli(args: list[str], tmp_path: Path, stdin: str = "") -> Command:
    env = {**os.environ, "VLLMINLINE_CACHE": str(tmp_path)}  # build the demo model here
    env.pop("MODEL", None)
    return Command([sys.executable, "-m", "vllm_inline", *args], env, stdin=stdin, timeout=300)


command("cli-demo")(lambda tmp_path: cli(["demo"], tmp_path))
command("cli-chat")(lambda tmp_path: cli(["chat"], tmp_path, stdin="Hello!\n"))


@pytest.mark.engine
@pytest.mark.launches("cli-demo")
def test_demo_streams_through_engine_langchain_and_llama_index(launches: Launches) -> None:
    result = launches.result("cli-demo")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for header in ("== vllm_inline.engine:", "== LangChain:", "== LlamaIndex:"):
        assert out.count(header) == 1, out
    parts = out.split("\n== ")[1:]
    assert len(parts) == 3
    for part in parts:
        lines = part.splitlines()
        assert ANSWER in lines, part
        match = SUMMARY.fullmatch(lines[lines.index(ANSWER) + 1])
        assert match, part
        assert int(match[1]) == len(
            SCENARIOS["demo"].script[: SCENARIOS["demo"].script.index("<|eot_id|>") + 1]
        )
    assert "hallucinated" not in out  # the invented turn after <|eot_id|> never shows
    assert "Starting vLLM" in result.stderr  # the progress line
    # The demo model's generation_config.json sets temperature 0.6 and top_p 0.9: used, and said.
    assert "Sampling: temperature=0.6, top_p=0.9 (the model's generation_config.json)" in out


@pytest.mark.engine
@pytest.mark.launches("cli-chat")
def test_chat_answers_a_line_from_stdin(launches: Launches) -> None:
    result = launches.result("cli-chat")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "you> assistant> " + ANSWER + "\n" in result.stdout
    assert SUMMARY.search(result.stdout)


def test_help_lists_both_commands() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "vllm_inline", "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    assert "demo" in result.stdout and "chat" in result.stdout


@pytest.mark.smoke
def test_version_is_the_installed_distributions() -> None:
    """One source: pyproject.toml's version, as the installed metadata records it."""
    import vllm_inline

    assert vllm_inline.__version__ == version("vllm-inline")
    result = subprocess.run(
        [sys.executable, "-m", "vllm_inline", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"vllm-inline {vllm_inline.__version__} (vllm"), result.stdout
    assert f"Python {sys.version_info.major}.{sys.version_info.minor}" in result.stdout
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    # (a regex, not tomllib: the package supports Python 3.10)
    declared = re.search(r'^version = "([^"]+)"', pyproject.read_text(), re.MULTILINE)
    assert declared and declared[1] == vllm_inline.__version__


def test_demo_samples_greedily_when_the_model_sets_no_sampling_values() -> None:
    """vLLM's own default is temperature 1.0, where a small real model rambles."""
    from vllm_inline.commands.console import demo_sampling

    sampling, line = demo_sampling({"repetition_penalty": 1.05, "max_tokens": 64})
    assert sampling == {"temperature": 0.0}
    assert line.startswith("Sampling: greedy, temperature=0")
    sampling, line = demo_sampling({"top_k": 64, "top_p": 0.95})  # Gemma 3's own values
    assert sampling == {}
    assert line == "Sampling: top_p=0.95, top_k=64 (the model's generation_config.json)"
