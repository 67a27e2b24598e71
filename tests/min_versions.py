"""Print the lowest versions pyproject.toml declares, as pip constraints (``make test-compat``).

As LangChain's monorepo does for its partner packages: the minimum of every declared range of
the runtime and framework dependencies is installed and tested, so the lower bounds are true.
``--test-tools`` prints the test requirements the compat subset needs (pytest and its plugins,
LangChain's retrievers), which are not pinned to their minimum: pip resolves them against the
pinned minimums. ``langchain`` itself (agents) is left out: see the Makefile's COMPAT_DESELECT.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

PINNED = ("transformers", "pydantic", "langchain-core", "llama-index-core")
"""The dependencies whose minimum is installed."""
TEST_TOOLS = ("pytest", "pytest-asyncio", "hypothesis", "langchain-classic")
"""What the compat subset needs to run, from the ``test`` extra."""


def requirements(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += extra
    return reqs


def minimum(requirement: str) -> tuple[str, str] | None:
    """``("langchain-core", "1.0")`` for ``"langchain-core>=1.0,<2"``; ``None`` without ``>=``."""
    match = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*(.*)$", requirement)
    if match is None:
        return None
    name, spec = match.groups()
    low = re.search(r">=\s*([0-9][^,;\s]*)", spec)
    return (name.lower(), low.group(1)) if low else None


def main(argv: list[str]) -> int:
    reqs = requirements(Path(__file__).resolve().parent.parent / "pyproject.toml")
    if "--test-tools" in argv:
        print(" ".join(r for r in reqs if (minimum(r) or (r,))[0] in TEST_TOOLS))
        return 0
    found = {}
    for r in reqs:
        low = minimum(r)
        if low is not None and low[0] in PINNED:
            found[low[0]] = low[1]
    missing = sorted(set(PINNED) - set(found))
    if missing:
        print(f"pyproject.toml declares no lower bound for {missing}", file=sys.stderr)
        return 1
    for name in PINNED:
        print(f"{name}=={found[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
