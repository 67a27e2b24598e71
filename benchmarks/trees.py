"""Versions of vllm-inline side by side, for ``compare.py``: git refs checked out into worktrees
(:func:`worktrees`), and each version's package imported from its own tree (:func:`use_tree`).

Importing this module in a process whose environment names a tree (:data:`TREE_ENV`) installs
that tree's finder: the processes vLLM spawns (the engine core) import the main script as
``__mp_main__``, which imports this module before anything imports ``vllm_inline``.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

__all__ = ["ROOT", "TREE_ENV", "TreeFinder", "git", "use_tree", "worktrees"]

ROOT = pathlib.Path(__file__).resolve().parent.parent
"""This checkout."""

TREE_ENV = "VLLMINLINE_COMPARE_TREE"
"""Set in a process to its tree by :func:`use_tree`, so that the processes it spawns import
``vllm_inline`` from the same tree (the last lines of this module)."""


class TreeFinder(importlib.abc.MetaPathFinder):
    """Finds ``vllm_inline`` and its remapped subpackages in a source tree, as the tree's own
    ``[tool.setuptools.package-dir]`` maps them. Only the mapped names are answered here; their
    submodules are found through the parents' ``__path__`` as usual."""

    def __init__(self, tree: pathlib.Path) -> None:
        config = tomllib.loads((tree / "pyproject.toml").read_text())
        mapping = config["tool"]["setuptools"].get("package-dir", {})
        self.dirs = {name: (tree / d).resolve() for name, d in mapping.items() if name}
        self.dirs.setdefault("vllm_inline", (tree / "vllm_inline").resolve())

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        d = self.dirs.get(fullname)
        if d is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, d / "__init__.py", submodule_search_locations=[str(d)]
        )


def use_tree(tree: pathlib.Path) -> None:
    """Import ``vllm_inline`` from ``tree`` from now on (before the editable install's finder),
    here and in the processes this one spawns."""
    assert not any(m == "vllm_inline" or m.startswith("vllm_inline.") for m in sys.modules)
    sys.meta_path.insert(0, TreeFinder(tree))
    os.environ[TREE_ENV] = str(tree)
    # Engine processes spawned (vLLM's way), on every side alike: a forked engine core comes from
    # a fork server that imports vllm_inline before this finder is installed there, so it would
    # run the editable install's tree, not this one.
    os.environ["VLLMINLINE_PROCESS_START"] = "spawn"


def git(*argv: str) -> str:
    """``git -C ROOT ...``'s output, stripped; raises if git fails."""
    return subprocess.run(
        ["git", "-C", str(ROOT), *argv], capture_output=True, text=True, check=True
    ).stdout.strip()


@contextlib.contextmanager
def worktrees(shas: dict[str, str | None]) -> Iterator[dict[str, pathlib.Path]]:
    """Name -> the tree of that commit: each checked out into a git worktree in a temporary
    directory (``None``: this checkout, as it is), removed at the end, also on error."""
    added: list[pathlib.Path] = []
    with tempfile.TemporaryDirectory(prefix="vllm-inline-compare-") as tmp:
        try:
            trees = {}
            for name, sha in shas.items():
                if sha is None:
                    trees[name] = ROOT
                    continue
                added.append(pathlib.Path(tmp) / f"{name.lower()}-{sha}")
                git("worktree", "add", "--detach", str(added[-1]), sha)
                trees[name] = added[-1]
            yield trees
        finally:
            for worktree in added:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                    check=False,
                )
            subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=False)


if os.environ.get(TREE_ENV) and not any(isinstance(f, TreeFinder) for f in sys.meta_path):
    use_tree(pathlib.Path(os.environ[TREE_ENV]))
