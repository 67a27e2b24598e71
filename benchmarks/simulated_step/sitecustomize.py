"""A SIMULATION for ``benchmarks/workers.py``, NOT A TEST: an engine core whose model step takes
a GPU's time and none of these CPUs'.

On ``PYTHONPATH`` with ``VLLMINLINE_SIMULATED_STEP`` (seconds) set, every process that loads
vLLM's Llama model gets its ``forward`` replaced: the step waits for the next tick of a fixed
cadence (one step every ``VLLMINLINE_SIMULATED_STEP`` seconds, not one after the other: a step
that ran late does not push the next ones) and returns the token embeddings, which the scripted
models' ``lm_head`` maps to their next token as the real layers do. Everything else runs for
real: vLLM's scheduler, the engine core's ZMQ, output processing, detokenizer, parsers, the
frameworks. The scripted models are Llama models; nothing else is patched.
"""

import importlib.abc
import importlib.util
import os
import sys
import time

STEP = float(os.environ.get("VLLMINLINE_SIMULATED_STEP") or 0)
MODULE = "vllm.model_executor.models.llama"


class _Cadence:
    tick = 0.0


def _forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **_):
    now = time.monotonic()
    _Cadence.tick = max(_Cadence.tick + STEP, now)
    time.sleep(_Cadence.tick - now)
    return self.model.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds


class _Patch(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            module.LlamaForCausalLM.forward = _forward

        spec.loader.exec_module = exec_module
        return spec


if STEP:
    sys.meta_path.insert(0, _Patch())

# The interpreter's own sitecustomize, if any, as vllm-inline's boot file does.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_self = sys.modules.pop("sitecustomize")
try:
    import sitecustomize  # noqa: F401
except ImportError as e:
    if e.name != "sitecustomize":
        raise
    sys.modules["sitecustomize"] = _self
