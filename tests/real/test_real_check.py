"""``python -m vllm_inline check --model <Gemma 3 270M>`` passes, as a user would run it.

A child process, as on the command line: its own engine with the CPU defaults (the user passes
no options), its own transformers reference. About two minutes on two CPU cores.
"""

from __future__ import annotations

import re
import subprocess
import sys

from vllm_inline.checks.parity import PENALTIES


def test_check_passes_on_gemma(gemma: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "vllm_inline", "check", "--model", gemma],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    table = done.stdout
    assert done.returncode == 0, f"{table}\n{done.stderr[-3000:]}"
    assert table.rstrip().endswith("PASSED"), table
    # Gemma 3 270M ships no chat template: the engine falls back to the gemma family's.
    assert re.search(r"^OK\s+chat template\s+.*gemma", table, re.MULTILINE | re.IGNORECASE), table
    # Both parity prompts at both penalties ran and none failed (a late divergence is a
    # warning; the row names the tokens both sides agreed on).
    for k in (1, 2):
        for penalty in PENALTIES:
            assert re.search(
                rf"^(OK|WARN)\s+greedy parity {k} \(rp {penalty}\)", table, re.MULTILINE
            ), table
