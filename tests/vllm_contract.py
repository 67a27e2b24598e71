"""Two ways to check the vLLM contract (``vllm_inline.engine.seam.contract.CONTRACT``).

:func:`check_installed` checks a :class:`Use` against the vLLM installed next to the tests
(imported); :func:`check_sources` against an unpacked vLLM wheel, parsed with :mod:`ast` and
never imported (how vLLM 0.33, which has no CPU build, is checked: ``make test-compat``).
``tests/test_vllm_contract.py`` also checks that the list covers every import in the seam
(``engine/seam/``) and that no other package module imports vLLM.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vllm_inline.engine.seam.contract import CONTRACT, Use
from vllm_inline.engine.seam.versions import at_least

__all__ = [
    "CONTRACT",
    "LLAMA3_JSON",
    "SOURCES_VARIABLE",
    "Llama3Json",
    "Sources",
    "Use",
    "check_installed",
    "check_sources",
    "llama3_json",
    "seam_imports",
    "source_roots",
    "tree_version",
]

SOURCES_VARIABLE = "VLLMINLINE_VLLM_SOURCES"
"""Environment variable naming unpacked vLLM source trees (``os.pathsep``-separated), which every
source-reading test checks besides the installed vLLM (``make check-vllm``, ``make
test-compat``)."""


# -- which vLLM trees the source-reading tests read ---------------------------------------------


def source_roots() -> list[Path]:
    """The installed vLLM's tree (found without importing it), then each tree named by
    :data:`SOURCES_VARIABLE`. A named tree without ``vllm/__init__.py`` is an error, raised
    while the tests are collected: a run asked to check a release must not pass without it."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations, "vLLM is not installed"
    roots = [Path(next(iter(spec.submodule_search_locations))).resolve().parent]
    for entry in os.environ.get(SOURCES_VARIABLE, "").split(os.pathsep):
        if not entry:
            continue
        root = Path(entry).resolve()
        if not (root / "vllm" / "__init__.py").is_file():
            msg = (
                f"{SOURCES_VARIABLE} names {entry!r}, which holds no vLLM sources "
                "(no vllm/__init__.py): unpack the wheel's .py files there, or run "
                "`make check-vllm VERSION=X`, which does"
            )
            raise FileNotFoundError(msg)
        roots.append(root)
    return roots


def tree_version(root: Path) -> str:
    """The vLLM release a source tree holds, from its ``vllm/_version.py``."""
    text = (root / "vllm" / "_version.py").read_text(encoding="utf-8")
    found = re.search(r"^__version__ = version = ['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    assert found, f"no version in {root / 'vllm' / '_version.py'}"
    return found.group(1)


# -- what vLLM's llama3_json tool parser does, by release ---------------------------------------


@dataclasses.dataclass(frozen=True)
class Llama3Json:
    """What one implementation of vLLM's ``llama3_json`` (the package's default tool parser for
    the llama3 family) does, read from its source (``test_llama3_json_is_as_expected``)."""

    module: str
    """Its module under ``vllm/tool_parsers``, as the registry names it."""
    cls: str
    """Its class in that module."""
    arguments_in_fragments: bool
    """True when it streams a call's arguments as they grow, False when whole, once the call
    ends."""
    needs_special_tokens: bool
    """True when its ``adjust_request`` sets ``skip_special_tokens=False``."""


LLAMA3_JSON = {
    "legacy": Llama3Json("llama_tool_parser", "Llama3JsonToolParser", True, False),
    "engine": Llama3Json("llama_json_engine_tool_parser", "LlamaJsonEngineToolParser", False, True),
}
"""0.30-0.33's parser (partial JSON diffs), and 0.34's (``vllm/parser/llama_json.py`` on vLLM's
parser engine: ``stream_arg_deltas=False``, ``ParserEngine.adjust_request``)."""


def llama3_json(version: str) -> Llama3Json:
    """The ``llama3_json`` of vLLM ``version``."""
    return LLAMA3_JSON["engine" if at_least(version, "0.34.0") else "legacy"]


# -- against the installed vLLM (imported) ------------------------------------------------------


def _resolve_installed(use: Use) -> tuple[Any, str]:
    errors = []
    for module_name in use.modules:
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError as e:
            errors.append(f"no module {module_name} ({e})")
            continue
        try:
            for part in use.name.split("."):
                obj = (
                    getattr(obj, part)
                    if not isinstance(obj, type)
                    else inspect.getattr_static(obj, part)
                )
        except AttributeError:
            errors.append(f"{module_name} has no {use.name}")
            continue
        return obj, module_name
    raise LookupError("; ".join(errors))


def _accepted_installed(obj: Any) -> tuple[set[str], bool]:
    """Keywords ``obj`` accepts, and whether it takes any (``**kwargs``)."""
    if isinstance(obj, (classmethod, staticmethod)):
        obj = obj.__func__
    names: set[str] = set()
    if isinstance(obj, type):
        if dataclasses.is_dataclass(obj):
            names |= {f.name for f in dataclasses.fields(obj)}
        names |= set(getattr(obj, "__struct_fields__", ()))  # msgspec
        names |= set(getattr(obj, "model_fields", {}))  # pydantic
        if names:
            return names, False
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return names, True
    any_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    return names | {p.name for p in params}, any_kw


def check_installed(use: Use) -> list[str]:
    """What of ``use`` the installed vLLM lacks (empty when it has everything, or when it is
    older than ``use.since``)."""
    from vllm_inline.engine.seam.versions import installed_at_least

    if use.since is not None and not installed_at_least(use.since):
        return []
    try:
        obj, _ = _resolve_installed(use)
    except LookupError as e:
        return [str(e)]
    problems = []
    if use.keywords:
        accepted, any_kw = _accepted_installed(obj)
        if not any_kw:
            problems += [f"{use}: no keyword {k!r}" for k in use.keywords if k not in accepted]
    for member in use.members:
        if not _has_member_installed(obj, member):
            problems.append(f"{use}: no member {member!r}")
    return problems


def _has_member_installed(cls: Any, member: str) -> bool:
    if hasattr(cls, member):
        return True
    if isinstance(cls, type):
        # Instance attributes set in __init__ (or declared as dataclass/struct/model fields).
        for klass in cls.__mro__:
            if member in getattr(klass, "__annotations__", {}):
                return True
            try:
                source = inspect.getsource(klass)
            except (OSError, TypeError):
                continue
            if f"self.{member} =" in source or f"self.{member}:" in source:
                return True
    return False


# -- against vLLM's sources (parsed, not imported) ---------------------------------------------


class Sources:
    """An unpacked vLLM wheel: the directory that holds the ``vllm`` package."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._trees: dict[str, ast.Module | None] = {}
        self._packages: set[str] = set()

    def module(self, name: str) -> ast.Module | None:
        if name not in self._trees:
            base = self.root.joinpath(*name.split("."))
            for path in (base.with_suffix(".py"), base / "__init__.py"):
                if path.is_file():
                    self._trees[name] = ast.parse(path.read_text(encoding="utf-8"))
                    if path.name == "__init__.py":
                        self._packages.add(name)
                    break
            else:
                self._trees[name] = None
        return self._trees[name]

    def find(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """The definition of ``module.name``: ``(defining module, node)``, following imports."""
        tree = self.module(module)
        if tree is None or depth > 8:
            return None
        for node in tree.body:
            found = _defines(node, name)
            if found is not None:
                return module, found
        for node in ast.walk(tree):  # re-exports, also inside ``if TYPE_CHECKING`` / try
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = _absolute(module, node, module in self._packages)
                        hit = self.find(source, alias.name, depth + 1)
                        if hit is None and self.module(f"{source}.{alias.name}") is not None:
                            return f"{source}.{alias.name}", self.module(f"{source}.{alias.name}")
                        if hit is not None:
                            return hit
        if self.module(f"{module}.{name}") is not None:  # a submodule (``from vllm import envs``)
            return f"{module}.{name}", self.module(f"{module}.{name}")
        # vLLM's lazy top-level exports: MODULE_ATTRS = {"Name": ".module:Name", ...}
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if (
                        isinstance(key, ast.Constant)
                        and key.value == name
                        and isinstance(value, ast.Constant)
                        and isinstance(value.value, str)
                    ):
                        target, _, attr = value.value.partition(":")
                        target = module + target if target.startswith(".") else target
                        return self.find(target, attr or name, depth + 1)
        if module.endswith(".envs") or module == "vllm.envs":
            # vllm.envs declares its variables in ``environment_variables = {"NAME": ...}``.
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and node.value == name:
                    return module, node
        return None

    def method(
        self, module: str, cls: ast.ClassDef, name: str, depth: int = 0
    ) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """The method ``name`` of ``cls`` or of the first base (found) that defines it."""
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return node
        if depth < 8:
            for base in cls.bases:
                base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
                hit = self.find(module, base_name) if base_name else None
                if hit is not None and isinstance(hit[1], ast.ClassDef):
                    found = self.method(hit[0], hit[1], name, depth + 1)
                    if found is not None:
                        return found
        return None

    def class_members(self, module: str, cls: ast.ClassDef, depth: int = 0) -> set[str]:
        """Names a class defines or sets on ``self``, with those of the bases found."""
        names: set[str] = set()
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        names.add(target.id)
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and isinstance(target.value, ast.Name)
                        and target.value.id == "self"
                    ):
                        names.add(target.attr)
        if depth < 8:
            for base in cls.bases:
                base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
                if base_name is None:
                    continue
                hit = self.find(module, base_name)
                if hit is not None and isinstance(hit[1], ast.ClassDef):
                    names |= self.class_members(hit[0], hit[1], depth + 1)
        return names


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    # In a package's __init__, level 1 is the package itself; in a module, its parent.
    base = parts[: len(parts) - node.level + (1 if is_package else 0)]
    return ".".join([*base, node.module] if node.module else base)


def _defines(node: ast.AST, name: str) -> ast.AST | None:
    if (
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.name == name
    ):
        return node
    if isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, ast.Name) and target.id == name:
                return node
    if (
        isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.target.id == name
    ):
        return node
    if isinstance(node, (ast.If, ast.Try)):
        for child in [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]:
            found = _defines(child, name)
            if found is not None:
                return found
    return None


def _function_keywords(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[set[str], bool]:
    args = node.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    return names, args.kwarg is not None


def check_sources(use: Use, sources: Sources, *, whatever_release: bool = False) -> list[str]:
    """What of ``use`` the vLLM at ``sources`` lacks, read from its parsed sources (nothing when
    that release is older than ``use.since``, unless ``whatever_release``)."""
    older = use.since is not None and not at_least(tree_version(sources.root), use.since)
    if older and not whatever_release:
        return []
    head, _, member = use.name.partition(".")
    hit = None
    for module in use.modules:
        hit = sources.find(module, head)
        if hit is not None:
            break
    if hit is None:
        return [f"{use}: not found in {sources.root}"]
    module, node = hit
    if member:
        if not isinstance(node, ast.ClassDef):
            return [f"{use}: {head} is not a class"]
        method = sources.method(module, node, member)
        if method is None:
            return [f"{use}: no member {member!r}"]
        node = method
    problems = []
    if use.keywords:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            accepted, any_kw = _function_keywords(node)
        elif isinstance(node, ast.ClassDef):
            accepted, any_kw = sources.class_members(module, node), False
            init = sources.method(module, node, "__init__")
            if init is not None:
                init_names, any_kw = _function_keywords(init)
                accepted |= init_names
        else:
            accepted, any_kw = set(), True
        if not any_kw:
            problems += [f"{use}: no keyword {k!r}" for k in use.keywords if k not in accepted]
    if use.members and not isinstance(node, ast.ClassDef):
        problems.append(f"{use}: not a class, so it has no members {use.members}")
    elif use.members:
        members = sources.class_members(module, node)
        problems += [f"{use}: no member {m!r}" for m in use.members if m not in members]
    return problems


def seam_imports(paths: list[Path]) -> Iterator[tuple[Path, str, str]]:
    """``(file, module, name)`` for every ``from vllm... import name`` in ``paths``."""
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and not node.level
                and node.module
                and (node.module == "vllm" or node.module.startswith("vllm."))
            ):
                for alias in node.names:
                    yield path, node.module, alias.name
