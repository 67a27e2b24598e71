"""Where the kit writes its models, and how a build is made safe to share between processes.

A built model lives in ``<root>/<name>-<digest>``. The digest covers the kit's own code and
templates, so any edit to the kit builds new directories instead of reusing stale ones. A model
is written into a temporary directory and renamed into place: a directory that exists is
complete, and two processes building at once both end up with the same one.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable

__all__ = ["build_once", "default_root", "kit_digest"]


def default_root() -> pathlib.Path:
    """``$VLLMINLINE_CACHE/scripted``, else ``~/.cache/vllm_inline/scripted``.

    Not ``VLLM_INLINE_...``: vLLM warns about every unknown ``VLLM_*`` variable at engine start
    (and refuses to start with ``fail_on_environ_validation=True``).
    """
    base = os.environ.get("VLLMINLINE_CACHE")
    if base:
        return pathlib.Path(base).expanduser() / "scripted"
    return pathlib.Path.home() / ".cache" / "vllm_inline" / "scripted"


@functools.lru_cache(maxsize=1)
def kit_digest() -> str:
    """SHA-256 (hex) of the kit's sources: every ``.py`` and ``.jinja`` file of this package."""
    package = pathlib.Path(__file__).parent
    files = sorted(p for p in package.rglob("*") if p.suffix in (".py", ".jinja"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def build_once(
    root: str | os.PathLike[str] | None,
    name: str,
    marker: str,
    write: Callable[[pathlib.Path], None],
) -> pathlib.Path:
    """Return ``<root>/<name>``, building it with ``write(directory)`` if it is not complete.

    ``write`` must write ``marker`` (a file name) last: its presence marks a complete build.
    ``root`` defaults to :func:`default_root`.
    """
    root_path = pathlib.Path(root).expanduser() if root is not None else default_root()
    target = root_path / name
    if (target / marker).is_file():
        return target
    root_path.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root_path))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        write(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / marker).is_file():  # not a concurrent build: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
