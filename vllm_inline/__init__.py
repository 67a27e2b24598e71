"""vllm-inline: vLLM inside the LangChain and LlamaIndex process.

Import what you use; nothing heavy loads here:

- :mod:`vllm_inline.engine` the shared engine (``get_engine``),
- :mod:`vllm_inline.integrations.langchain` (``ChatVLLM``),
- :mod:`vllm_inline.integrations.llama_index` (``VLLM``),
- :mod:`vllm_inline.testing` tiny models whose answer is known, to test your own chains on a
  real engine on a CPU (``scripted_model``).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    # One source: pyproject.toml's version, as the installed distribution records it.
    __version__ = version("vllm-inline")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
