"""vllm-inline: vLLM inside the LangChain and LlamaIndex process.

Import what you use; nothing heavy loads here:

- :mod:`vllm_inline.engine` the shared engine (``get_engine``),
- :mod:`vllm_inline.integrations.langchain` (``ChatVLLM``),
- :mod:`vllm_inline.integrations.llama_index` (``VLLM``).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
