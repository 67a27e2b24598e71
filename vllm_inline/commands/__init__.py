"""The commands of ``python -m vllm_inline`` (:mod:`vllm_inline.cli`), one module each: ``demo``,
``chat``, ``check``, ``serve``, ``run`` and ``engines``. Each has ``add_arguments(parser)``
and ``run(args) -> int``, and imports what it runs only when it runs (nothing of vLLM or torch at
import); ``serve`` also takes ``vllm serve``'s own options (``EXTRA_ARGUMENTS``) and checks its
arguments together before it runs (``argument_problem``)."""
