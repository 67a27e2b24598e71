"""The engine's life: what is decided and started once per engine, and how it ends.

:mod:`.runtime` starts one engine (vLLM's ``AsyncLLM`` on its loop thread) and keeps what was
decided at start: the options chosen for the machine (:mod:`.platform_defaults`), the chat
template (:mod:`.templates`), the stop policy (:mod:`.stops`), the media policy and the stats
book (:mod:`.metrics`). :mod:`.together` starts and stops several engines at once, with one
memory plan (:mod:`.memory_plan`).
"""
