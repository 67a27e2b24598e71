"""The engine's event-loop thread and the one bridge between it and its callers.

Every engine runs vLLM's ``AsyncLLM`` on a private event loop in a daemon thread
(:class:`.bridge.LoopThread`). A stream is one async generator on that loop; :mod:`.bridge`
hands its items to a caller's event loop or to a synchronous caller, and :mod:`.window` keeps
the engine side only a few items ahead of a slow consumer. Standard library only.
"""
