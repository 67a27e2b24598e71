"""The request on its way in: checked before any engine work, then rendered on the engine loop.

:mod:`.request` builds a checked :class:`.request.Request` from a call's arguments (messages
and tools: :mod:`.messages`; images: :mod:`.images`; sampling values: :mod:`.sampling`; the
LoRA adapter a call names: :mod:`.lora`), refusing bad input with a typed error that names the
parameter. :mod:`.render` turns it into the prompt token ids vLLM prefills.
"""
