"""The host engine's pieces that need no engine (engine/host/): ``keep_alive`` values, the
private directory, what crosses the socket, and the refusal of an engine of other versions.
The engines themselves: tests/parallel/test_host_engine.py."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_inline.engine import BadRequestError, ContextLengthExceededError, ModelLoadError
from vllm_inline.engine.host import directory as files
from vllm_inline.engine.host import wire
from vllm_inline.engine.host.attach import attach, normalized_model
from vllm_inline.engine.host.status import versions
from vllm_inline.integrations.langchain import ChatVLLM, VLLMEmbeddings, VLLMRerank
from vllm_inline.integrations.llama_index import VLLM, VLLMEmbedding
from vllm_inline.integrations.llama_index import VLLMRerank as LlamaIndexRerank


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("10m", 600.0),
        ("1h30m", 5400.0),
        ("45s", 45.0),
        ("500ms", 0.5),
        (600, 600.0),
        ("600", 600.0),
        (2.5, 2.5),
        (0, 0.0),
        ("0", 0.0),
        (-1, float("inf")),
        ("-1", float("inf")),
        ("-5m", None),  # not a duration: refused below
        (None, None),
    ],
)
def test_keep_alive_takes_ollamas_values(value: object, seconds: float | None) -> None:
    if value == "-5m":
        with pytest.raises(BadRequestError):
            files.parse_keep_alive(value)
        return
    assert files.parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["soon", "10 minutes", "", "1d", True, [1], float("nan")])
def test_a_bad_keep_alive_is_refused_naming_it(value: object) -> None:
    with pytest.raises(BadRequestError) as raised:
        files.parse_keep_alive(value)
    assert raised.value.parameter == "keep_alive" and "keep_alive=" in str(raised.value)


@pytest.mark.parametrize("seconds", [0.0, 45.0, 600.0, 7200.0, float("inf"), 2.5])
def test_keep_alive_is_shown_as_it_is_read(seconds: float) -> None:
    assert files.parse_keep_alive(files.show_keep_alive(seconds)) == seconds


@pytest.mark.parametrize(
    "make",
    [
        lambda: ChatVLLM(model="m", keep_alive="soon"),
        lambda: VLLMEmbeddings(model="m", keep_alive="soon"),
        lambda: VLLMRerank(model="m", keep_alive="soon"),
        lambda: VLLM(model="m", keep_alive="soon"),
        lambda: VLLMEmbedding(model="m", keep_alive="soon"),
        lambda: LlamaIndexRerank(model="m", keep_alive="soon"),
    ],
)
def test_every_class_refuses_a_bad_keep_alive_when_built(make: object) -> None:
    with pytest.raises(ValueError, match="keep_alive='soon' is invalid"):
        make()  # type: ignore[operator]


def test_the_environment_variable_is_checked_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_inline.engine import get_engine

    monkeypatch.setenv(files.KEEP_ALIVE_VARIABLE, "later")
    with pytest.raises(BadRequestError, match=files.KEEP_ALIVE_VARIABLE):
        get_engine("some/model")
    monkeypatch.setenv(files.KEEP_ALIVE_VARIABLE, "10m")
    engine = get_engine("some/model")
    assert engine.attached and engine is get_engine("some/model")
    assert not get_engine("some/model", keep_alive=None).started  # nothing attached yet
    monkeypatch.delenv(files.KEEP_ALIVE_VARIABLE)
    assert not get_engine("some/model").attached  # without it: an engine of this process


def test_the_key_is_the_same_for_the_same_model_and_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert files.engine_key("m", {"a": 1, "b": 2}) == files.engine_key("m", {"b": 2, "a": 1})
    assert files.engine_key("m", {"a": 1}) != files.engine_key("m", {"a": 2})
    assert files.engine_key("m", {}) != files.engine_key("n", {})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    assert normalized_model("model") == str(tmp_path / "model")
    assert normalized_model("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"


def test_the_directory_is_private_and_refused_when_it_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(files.DIRECTORY_VARIABLE, str(tmp_path / "host"))
    path = files.host_directory()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    key = files.secret(path)
    assert len(key) == 32 and files.secret(path) == key
    assert stat.S_IMODE(os.stat(os.path.join(path, "key")).st_mode) == 0o600
    os.chmod(path, 0o755)
    with pytest.raises(ModelLoadError, match="not private to this user"):
        files.host_directory()


def test_errors_cross_the_socket_with_their_type_and_fields() -> None:
    sent = ContextLengthExceededError("too long", parameter="messages", value=[1, 2])
    got = wire.exception_from_wire(wire.exception_to_wire(sent))
    assert type(got) is ContextLengthExceededError
    assert (str(got), got.parameter, got.value) == ("too long", "messages", [1, 2])
    assert type(wire.exception_from_wire(wire.exception_to_wire(KeyError("k")))) is KeyError

    class Strange(Exception):
        pass

    other = wire.exception_from_wire(wire.exception_to_wire(Strange("odd")))
    assert "Strange" in str(other) and "odd" in str(other)


def test_a_frame_round_trips_and_the_peer_is_this_user() -> None:
    left, right = socket.socketpair(socket.AF_UNIX)
    with left, right:
        left.sendall(wire.frame(("delta", 7, {"text": "hi"})))
        assert wire.read_frame_blocking(right) == ("delta", 7, {"text": "hi"})
        assert wire.peer(right) in (None, (os.getpid(), os.getuid()))


def test_an_engine_of_other_versions_is_an_error_naming_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record whose owner runs (this test's own process stands in for it) with another
    vllm-inline: attaching is refused before any connection, naming both and the command."""
    monkeypatch.setenv(files.DIRECTORY_VARIABLE, str(tmp_path / "host"))
    directory = files.host_directory()
    key = files.engine_key("some/model", {})
    theirs = {**versions(), "vllm-inline": "0.0.1"}
    files.Record(
        key=key,
        model="some/model",
        options={},
        pid=os.getpid(),
        start=files.this_process_start(),
        versions=theirs,
        keep_alive=600.0,
    ).write(directory)
    with pytest.raises(ModelLoadError) as raised:
        attach("some/model", {}, 600.0)
    message = str(raised.value)
    assert "vllm-inline 0.0.1" in message and f"vllm-inline {versions()['vllm-inline']}" in message
    assert "python -m vllm_inline engines stop some/model" in message


def test_a_record_left_by_a_dead_owner_is_listed_as_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(files.DIRECTORY_VARIABLE, str(tmp_path / "host"))
    directory = files.host_directory()
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    files.Record(
        key="k", model="some/model", options={}, pid=int(ended.stdout), start=1,
        versions=versions(), keep_alive=0.0,
    ).write(directory)  # fmt: skip
    listed = subprocess.run(
        [sys.executable, "-m", "vllm_inline", "engines"],
        capture_output=True, text=True, check=False, env={**os.environ},
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert "some/model" in listed.stdout and "gone (removed at next use)" in listed.stdout
    assert "torch" not in listed.stderr
