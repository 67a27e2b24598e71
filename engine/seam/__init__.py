"""The vLLM seam: every vLLM name the package touches, and nothing of the package above it.

vLLM's API moves between releases, so every vLLM import of vllm-inline is in this folder, and
:mod:`.contract` lists each name used (``tests/test_vllm_contract.py`` checks the list against
the installed vLLM and the sources of the newest release; docs/compatibility.md). The modules
here import only the standard library, vLLM and :mod:`vllm_inline.engine.errors`; those that
must run before vLLM is imported (:mod:`.vllm_boot`, :mod:`.vllm_quiet`,
:mod:`.vllm_processes`, :mod:`.versions`) import vLLM only inside their functions.
"""
