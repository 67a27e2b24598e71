"""A vLLM release's sources, for the source-reading tests (``make check-vllm``, ``make test-compat``).

``python tests/vllm_wheel.py --cache DIR 0.34.0 [0.33.0 ...]`` downloads each release's wheel from
the package index (``pip download --no-deps --only-binary=:all:``: no dependency, nothing
installed, nothing imported), unpacks its ``.py`` files and its metadata into ``DIR/<version>``,
deletes the wheel, and prints the unpacked trees joined with ``os.pathsep``: the value of
``VLLMINLINE_VLLM_SOURCES``. A tree already unpacked is reused. It also prints, to stderr, what
the release requires of the packages vllm-inline pins a minimum of (``transformers``,
``pydantic``) and ``torch``, for the routine in docs/compatibility.md.

Any failure (no such release, no network) exits non-zero, naming the release: a check must never
run without the tree it was asked for.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

__all__ = ["fetch", "requirements"]

WATCHED = ("torch", "transformers", "pydantic")
"""The requirements printed: vLLM's torch pin, and the packages pyproject.toml pins a minimum of."""


def _unpacked(tree: Path) -> bool:
    return (tree / "vllm" / "__init__.py").is_file()


def fetch(version: str, cache: Path) -> Path:
    """``cache/<version>``, holding vLLM ``version``'s ``.py`` files and ``METADATA``."""
    if not re.fullmatch(r"\d+\.\d+\.\d+(\w|\.)*", version):
        msg = f"{version!r} is not a vLLM release number (e.g. 0.34.0)"
        raise ValueError(msg)
    tree = cache / version
    if _unpacked(tree):
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=f".{version}-") as work:
        download = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--only-binary=:all:", "--dest", work, f"vllm=={version}",
        ]  # fmt: skip
        print(f"downloading the vllm {version} wheel (no dependencies) ...", file=sys.stderr)
        subprocess.run(download, check=True)
        (wheel,) = Path(work).glob("vllm-*.whl")
        staged = Path(work) / "tree"
        with zipfile.ZipFile(wheel) as archive:
            names = [
                n
                for n in archive.namelist()
                if n.endswith(".py") or re.fullmatch(r"vllm-[^/]+\.dist-info/METADATA", n)
            ]
            archive.extractall(staged, names)
        if not _unpacked(staged):
            msg = f"the vllm {version} wheel holds no vllm/__init__.py"
            raise RuntimeError(msg)
        shutil.rmtree(tree, ignore_errors=True)  # a partial tree from an interrupted run
        staged.rename(tree)  # whole or not at all
    return tree


def requirements(tree: Path) -> list[str]:
    """The release's ``Requires-Dist`` lines for :data:`WATCHED` (none if its metadata is not
    there: trees unpacked by hand keep only the ``.py`` files)."""
    found = []
    for metadata in tree.glob("vllm-*.dist-info/METADATA"):
        message = Parser().parsestr(metadata.read_text(encoding="utf-8"))
        for line in message.get_all("Requires-Dist") or []:
            name = re.split(r"[\s<>=!~;\[(]", line, maxsplit=1)[0].lower()
            if name in WATCHED and "extra ==" not in line:
                found.append(line)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="+", help="vLLM releases, e.g. 0.34.0")
    parser.add_argument("--cache", type=Path, required=True, help="where trees are unpacked")
    args = parser.parse_args(argv)
    trees = []
    for version in args.versions:
        try:
            tree = fetch(version, args.cache)
        except (subprocess.CalledProcessError, ValueError, RuntimeError) as e:
            print(f"vllm {version}: no sources to check ({e})", file=sys.stderr)
            return 1
        print(f"vllm {version}: sources in {tree}", file=sys.stderr)
        for line in requirements(tree):
            print(f"vllm {version} requires {line}", file=sys.stderr)
        trees.append(str(tree))
    print(os.pathsep.join(trees))
    return 0


if __name__ == "__main__":
    sys.exit(main())
