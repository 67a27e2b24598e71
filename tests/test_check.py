"""``python -m vllm_inline check``: passes on every scripted model family (real engines, real
``transformers`` reference), fails with a clear line on deliberately broken model directories."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vllm_inline.checks import CONVERSATION, run_check
from vllm_inline.engine import get_engine

pytestmark = pytest.mark.engine


def rows(report: Any) -> dict[str, Any]:
    return {r.name: r for r in report.rows}


@pytest.mark.parametrize("name", ["llama3", "chatml", "gemma", "chatml_tools"])
def test_check_passes_on_every_scripted_family(scripted: Any, name: str) -> None:
    s = scripted(name)
    report = run_check(s.path, vllm_kwargs=s.engine_kwargs)
    table = report.render()
    assert report.passed, table
    by_name = rows(report)
    assert by_name["chat template"].value == "tokenizer"
    assert by_name["end of turn"].status == "ok", table
    assert by_name["special tokens in content"].status == "ok", table
    assert by_name["stops at end of turn"].status == "ok", table
    assert s.scenario.chat.stop in by_name["stops at end of turn"].value
    parity = [r for r in report.rows if r.name.startswith("greedy parity")]
    assert len(parity) == 4 and all(r.status == "ok" for r in parity), table
    assert all(r.value == "48/48 tokens identical" for r in parity)
    prompt = report.blocks["rendered prompt (system, user, assistant, user)"]
    for message in CONVERSATION[1:]:  # Gemma folds the system text into the first user turn
        assert message["content"] in prompt
    assert table.rstrip().endswith("PASSED")
    if name == "chatml_tools":
        trip = by_name["tool round trip"]
        assert (
            trip.status == "ok" and trip.value.startswith("get_weather(") and "hermes" in trip.value
        )
        assert "The weather in Oslo is sunny." in trip.detail


def test_check_fails_when_the_templates_end_of_turn_is_not_a_stop_token(
    scripted: Any, tmp_path: Path
) -> None:
    s = scripted("llama3")
    broken = tmp_path / "eot-broken"
    shutil.copytree(s.path, broken)
    config_path = broken / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    # Assistant turns end with <|python_tag|>, which neither generation_config's EOS, the
    # tokenizer's EOS nor the Llama-3 family's end-of-turn list names.
    config["chat_template"] = config["chat_template"].replace("<|eot_id|>", "<|python_tag|>")
    config_path.write_text(json.dumps(config))
    try:
        report = run_check(str(broken), vllm_kwargs=s.engine_kwargs)
    finally:
        get_engine(str(broken), **s.engine_kwargs).shutdown()
    table = report.render()
    assert not report.passed
    failed = [r for r in report.rows if r.status == "fail"]
    assert [r.name for r in failed] == ["end of turn"], table
    assert failed[0].value.startswith("<|python_tag|> (id ")
    assert failed[0].value.endswith(") is not a stop token")
    assert "generation_config.json" in failed[0].detail and "eos_token_id" in failed[0].detail
    assert "FAIL  end of turn" in table and table.rstrip().endswith("FAILED (1 row(s) failed)")


def test_cli_check_fails_with_a_clear_line_on_a_missing_tokenizer(
    scripted: Any, tmp_path: Path
) -> None:
    s = scripted("chatml")
    broken = tmp_path / "no-tokenizer"
    shutil.copytree(s.path, broken, ignore=shutil.ignore_patterns("tokenizer*"))
    env = {k: v for k, v in os.environ.items() if k != "MODEL"}
    result = subprocess.run(
        [sys.executable, "-m", "vllm_inline", "check", "--model", str(broken)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    flat = " ".join(result.stdout.split())  # the table wraps long messages
    assert "FAIL engine start ModelLoadError" in flat
    assert "has no tokenizer" in flat and "tokenizer.json" in flat
    assert result.stdout.rstrip().endswith("FAILED (1 row(s) failed)")


def test_cli_check_needs_a_model() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MODEL"}
    result = subprocess.run(
        [sys.executable, "-m", "vllm_inline", "check"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2 and "--model" in result.stderr
