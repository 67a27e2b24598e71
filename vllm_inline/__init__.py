"""vllm-inline: vLLM inside the LangChain and LlamaIndex process.

Import what you use; nothing heavy loads here:

- :mod:`vllm_inline.engine` the shared engine (``get_engine``),
- :mod:`vllm_inline.integrations.langchain` (``ChatVLLM``),
- :mod:`vllm_inline.integrations.llama_index` (``VLLM``),
- :mod:`vllm_inline.testing` tiny models whose answer is known, to test your own chains on a
  real engine on a CPU (``scripted_model``).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
