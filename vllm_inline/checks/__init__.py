"""Does vllm-inline run a model right? The checks behind ``python -m vllm_inline check``
(:mod:`vllm_inline.commands.check`): :func:`run_check` and the table it returns."""

from vllm_inline.checks.check import CONVERSATION, run_check
from vllm_inline.checks.report import Report, Row

__all__ = ["CONVERSATION", "Report", "Row", "run_check"]
