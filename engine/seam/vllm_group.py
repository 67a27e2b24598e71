"""Engine cores for several front-end processes: what ``vllm serve --api-server-count N`` does.

vLLM's server runs N API-server processes against one set of engine cores
(``vllm/entrypoints/cli/serve.py`` ``run_multi_api_server``): the launcher builds the engine's
config, launches the engine cores with one input and one output address per front end
(``launch_core_engines``), and each front end builds ``AsyncLLM(client_addresses=...,
client_count=N, client_index=i)`` on its pair, with its own tokenizer, detokenizer and output
processing. :func:`launch_shared` is the launcher's half, for one model; the front end's half is
:func:`.vllm_engine.start_engine` with ``client=``.

Unlike vLLM's launcher, which binds every front end's sockets before its API servers exist
(``bind_engine_zmq_listeners``, 0.32 on), the addresses here are IPC names that each front end binds
itself when its app starts the engine (the engine cores connect and their messages wait until
it does): the workers are already running when the first of them asks for an engine.

Called in the worker that starts a model's engine for its group (:mod:`..life.group`): that
worker owns the engine cores, which vLLM spawns as for one engine (no fork server: a group's
engine processes hold one copy of torch and vLLM each, as ``vllm serve``'s do).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections.abc import Mapping
from typing import Any

from vllm import AsyncEngineArgs
from vllm.v1.engine.utils import EngineZmqAddresses, launch_core_engines
from vllm.v1.executor import Executor

from vllm_inline.engine.seam import ipc_directory
from vllm_inline.engine.seam.vllm_engine import engine_options
from vllm_inline.engine.seam.vllm_processes import remote_peer_deadline, spawn_environment

__all__ = ["SharedCores", "launch_shared"]


@dataclasses.dataclass
class SharedCores:
    """The engine cores of one model, serving ``count`` front ends."""

    model: str
    """The model they run."""
    count: int
    """How many front ends (client indexes ``0..count-1``) they serve."""
    inputs: list[str]
    """Each front end's input address (requests), by client index."""
    outputs: list[str]
    """Each front end's output address (outputs), by client index."""
    manager: Any
    """vLLM's ``CoreEngineProcManager``: the engine-core processes."""

    def client(self, index: int) -> dict[str, Any]:
        """What front end ``index`` passes to :func:`.vllm_engine.start_engine` as ``client``."""
        return {
            "addresses": {
                "input_address": self.inputs[index],
                "output_address": self.outputs[index],
            },
            "count": self.count,
            "index": index,
        }

    def clients(self) -> list[dict[str, Any]]:
        """:meth:`client` of every front end, by client index."""
        return [self.client(index) for index in range(self.count)]

    def pids(self) -> list[int]:
        """The engine-core processes' pids."""
        return [int(proc.pid) for proc in getattr(self.manager, "processes", ())]

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine cores (their front ends see them go)."""
        self.manager.shutdown(timeout=timeout)


def launch_shared(
    model: str, kwargs: Mapping[str, Any], environment: Mapping[str, str], count: int
) -> SharedCores:
    """Start ``model``'s engine cores for ``count`` front ends and wait until they are up
    (blocking: the model loads). ``kwargs``: the engine options every front end builds its
    ``AsyncLLM`` with; ``environment``: set while the processes start, as for one engine."""
    options = engine_options(kwargs)
    args = AsyncEngineArgs(model=model, **options)
    # As run_multi_api_server does: the config knows how many front ends share the cores (the
    # multimodal processor cache is mirrored between one front end and its core only).
    args._api_process_count = count
    args._api_process_rank = -1
    # The usage context the front ends' from_engine_args uses: it sets batch-size defaults.
    config = args.create_engine_config()
    executor_class = Executor.get_class(config)
    # In this process's owner directory with the engine's other sockets (.ipc_directory): this
    # user's only, removed with the owner however the group ends.
    owner = ipc_directory.owner_directory()
    addresses = EngineZmqAddresses(
        inputs=[f"ipc://{os.path.join(owner, secrets.token_hex(12))}" for _ in range(count)],
        outputs=[f"ipc://{os.path.join(owner, secrets.token_hex(12))}" for _ in range(count)],
    )
    # The front ends' AsyncLLM logs stats when it has stat loggers: with the caller's stats on
    # (.vllm_engine.start_engine), whatever disable_log_stats says.
    log_stats = kwargs.get("disable_log_stats") is not True
    with (
        spawn_environment(environment),
        remote_peer_deadline(options),
        launch_core_engines(config, executor_class, log_stats, addresses) as launch,
    ):
        manager = launch.engine_manager
    return SharedCores(
        model=model,
        count=count,
        inputs=list(addresses.inputs),
        outputs=list(addresses.outputs),
        manager=manager,
    )
