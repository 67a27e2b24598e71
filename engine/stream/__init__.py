"""The stream on its way out: vLLM's DELTA outputs become typed deltas.

:mod:`.generate` is the one streaming path: it runs a rendered request on vLLM, feeds each
output through vLLM's tool and reasoning parsers (:mod:`.parsing`) and yields
:class:`.deltas.Delta` objects. :mod:`.openai_format` turns deltas into OpenAI's wire format.
"""
