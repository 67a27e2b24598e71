"""A first run reads clean: an engine start, an answer and a shutdown through ``ChatVLLM`` (or no
shutdown: the script just ends) print the answer, vLLM's weight-loading progress and nothing
else, and nothing is reported as leaked at exit. vLLM's start-up noise and how it is silenced: ``engine/seam/vllm_quiet.py``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from launches import Command, Launches, command

from vllm_inline.engine.seam import vllm_boot, vllm_quiet
from vllm_inline.testing import SCENARIOS

# What a first run printed before (issue 30): each must be gone.
NOISE = (
    "Triton is installed, but doesn't include CPU backend",
    "FutureWarning",
    "NUMA binding",
    "leaked",
    "resource_tracker",
)
PROGRESS = "Loading safetensors checkpoint shards"

SCRIPT = textwrap.dedent(
    """
    from vllm_inline.integrations.langchain import ChatVLLM
    from vllm_inline.testing import build_scripted_model

    if __name__ == "__main__":
        llm = ChatVLLM(model=str(build_scripted_model("llama3")), max_tokens=16)
        print("ANSWER:", llm.invoke("Hi").content, flush=True)
        llm.engine.shutdown()
    """
)
WITHOUT_SHUTDOWN = SCRIPT.replace("    llm.engine.shutdown()\n", "")
assert WITHOUT_SHUTDOWN != SCRIPT
"""The same script as most users write it: it just ends (issue 63: vLLM's output handler then
logged an ERROR traceback at exit)."""


def _environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "VLLMINLINE_CACHE": str(tmp_path / "cache"), **extra}
    for name in ("VLLM_LOGGING_LEVEL", "TORCH_CPP_LOG_LEVEL", "PYTHONWARNINGS"):
        if name not in extra:
            env.pop(name, None)
    return env


def _first_run(source: str, tmp_path: Path) -> Command:
    script = tmp_path / "first_run.py"
    script.write_text(source)
    # The engine's own CPU defaults, as in the README snippet: no vllm_kwargs.
    return Command([sys.executable, str(script)], _environment(tmp_path), cwd=tmp_path)


@command("first-run")
def first_run(tmp_path: Path) -> Command:
    return _first_run(SCRIPT, tmp_path)


@command("first-run-no-shutdown")
def first_run_no_shutdown(tmp_path: Path) -> Command:
    return _first_run(WITHOUT_SHUTDOWN, tmp_path)


@pytest.mark.engine
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.launches(name))
        for name in ("first-run", "first-run-no-shutdown")
    ],
)
def test_chatvllm_start_answer_and_end_print_only_the_answer_and_progress(
    launches: Launches, name: str
) -> None:
    result = launches.result(name)
    assert result.returncode == 0, result.stderr[-3000:]
    # vLLM's INFO lines go to stdout: none of them either.
    assert result.stdout == f"ANSWER: {SCENARIOS['llama3'].answer}\n", result.stdout[-3000:]
    for noise in NOISE:
        assert noise not in result.stderr, result.stderr
    lines = [line.strip() for line in re.split(r"[\r\n]", result.stderr) if line.strip()]
    assert lines, "vLLM's weight-loading progress is expected on stderr"
    assert all(line.startswith(PROGRESS) for line in lines), result.stderr


# -- the pieces, no engine --------------------------------------------------------------------


def test_quiet_by_default_and_one_setting_brings_vllms_logs_back(monkeypatch) -> None:
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    environment = vllm_boot.engine_environment()
    assert environment["VLLM_LOGGING_LEVEL"] == "ERROR"
    assert environment["TORCH_CPP_LOG_LEVEL"] == "ERROR"
    for verbose in ("WARNING", "INFO", "debug"):
        monkeypatch.setenv("VLLM_LOGGING_LEVEL", verbose)
        assert not vllm_quiet.quiet()
        assert vllm_quiet.quiet_environment() == {}
        # The boot directory stays: the engine's processes still end with this one (and keep
        # their files in this process's directory).
        assert set(vllm_boot.engine_environment()) == {
            "PYTHONPATH",
            "VLLMINLINE_PARENT_PID",
            "VLLM_RPC_BASE_PATH",
        }
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "CRITICAL")
    assert vllm_boot.engine_environment()["VLLM_LOGGING_LEVEL"] == "CRITICAL"
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "INFO")  # the user's own choice stays
    assert "TORCH_CPP_LOG_LEVEL" not in vllm_boot.engine_environment()


def test_engine_processes_start_with_the_filters_and_their_own_sitecustomize(
    monkeypatch, tmp_path: Path
) -> None:
    """What an engine process gets at start-up, before vLLM is imported there: vLLM's level on
    the ``vllm`` logger, the one ``FutureWarning`` ignored, the interpreter's own
    ``sitecustomize`` still run, and ``sys.path`` as it would be without us."""
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import sys\nsys.own_sitecustomize_ran = True\n")
    monkeypatch.setenv("PYTHONPATH", str(own))
    environment = vllm_boot.engine_environment()
    boot = environment["PYTHONPATH"].split(os.pathsep)[0]
    code = textwrap.dedent(
        f"""
        import logging, sys, warnings
        assert logging.getLogger("vllm").level == logging.ERROR
        assert sys.own_sitecustomize_ran
        assert {boot!r} not in sys.path
        logging.getLogger("vllm.triton_utils.importing").warning("dropped")
        logging.getLogger("vllm_inline").warning("kept")
        warnings.warn_explicit("`torch.distributed.reduce_op` is deprecated, please use ...",
                               FutureWarning, "dispatcher.py", 138, "vllm.triton_utils.dispatcher")
        warnings.warn_explicit("another deprecation", FutureWarning, "dispatcher.py", 139,
                               "vllm.triton_utils.dispatcher")
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **environment},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok\n"
    assert "dropped" not in result.stderr and "reduce_op" not in result.stderr
    assert "kept" in result.stderr and "another deprecation" in result.stderr


def test_install_filters_leaves_vllm_alone_at_verbose_levels(monkeypatch) -> None:
    import logging

    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    vllm_logger = logging.getLogger("vllm")
    before = vllm_logger.level
    vllm_quiet.install_filters()
    assert vllm_logger.level == before
