"""The package's shape: imports run one way between the engine's stage folders, no import
circle anywhere, no module too long to read in one sitting (docs/architecture.md).

Every import counts, those inside functions and under ``TYPE_CHECKING`` too: a lazy import that
closes a circle is still a circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {  # pyproject.toml's package-dir
    "vllm_inline": ROOT / "vllm_inline",
    "vllm_inline.engine": ROOT / "engine",
    "vllm_inline.integrations": ROOT / "integrations",
}
ENGINE_LAYERS = (  # lowest first: each may import from itself and those before it
    ("errors", ("vllm_inline.engine.errors",)),
    ("seam", ("vllm_inline.engine.seam",)),
    ("loop", ("vllm_inline.engine.loop",)),
    ("life", ("vllm_inline.engine.life",)),
    ("request", ("vllm_inline.engine.request",)),
    ("stream", ("vllm_inline.engine.stream",)),
    ("pooling", ("vllm_inline.engine.pooling",)),
    ("facade", ("vllm_inline.engine.engine",)),
    ("host", ("vllm_inline.engine.host",)),
    ("registry", ("vllm_inline.engine.registry", "vllm_inline.engine")),
)
LIMITS = {
    "engine": 400,
    "integrations": 400,
    "vllm_inline": 400,
    "examples": 400,
    "benchmarks": 500,
}
"""Lines a module may have, by folder (STYLE.md: small enough to read in one sitting)."""


def _modules() -> dict[str, Path]:
    found = {}
    for package, directory in PACKAGE_DIRS.items():
        for path in directory.rglob("*.py"):
            parts = list(path.relative_to(directory).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([package, *parts])
            if name.startswith("vllm_inline.engine") and package == "vllm_inline":
                continue  # not a package directory of its own
            found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """The package modules ``name`` imports, with the line of each import."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            candidates = [f"{target}.{alias.name}" for alias in node.names]
            submodules = [c for c in candidates if c in MODULES]
            targets = submodules or ([target] if target in MODULES else [])
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names if alias.name in MODULES]
        else:
            continue
        for target in targets:
            if target != name:
                yield target, node.lineno


GRAPH = {name: sorted(set(_imports(name, path))) for name, path in MODULES.items()}


def _layer(name: str) -> int | None:
    for index, (_, prefixes) in reversed(list(enumerate(ENGINE_LAYERS))):
        for prefix in prefixes:
            if name == prefix or (prefix != "vllm_inline.engine" and name.startswith(prefix + ".")):
                return index
    return None


def test_the_module_map_finds_the_package():
    assert "vllm_inline.engine.seam.vllm_engine" in MODULES
    assert "vllm_inline.integrations.langchain.chat_models" in MODULES
    assert all(
        _layer(name) is not None for name in MODULES if name.startswith("vllm_inline.engine")
    )


def test_engine_imports_run_one_way():
    """A stage imports only from itself and the stages below it (ENGINE_LAYERS)."""
    upward = []
    for name, imports in GRAPH.items():
        layer = _layer(name)
        if layer is None:
            continue
        for target, line in imports:
            target_layer = _layer(target)
            if target_layer is not None and target_layer > layer:
                upward.append(
                    f"{MODULES[name].relative_to(ROOT)}:{line} ({ENGINE_LAYERS[layer][0]}) "
                    f"imports {target} ({ENGINE_LAYERS[target_layer][0]})"
                )
    assert not upward, "imports from a lower stage to a higher one:\n" + "\n".join(upward)


def test_no_import_circle():
    """Tarjan's strongly connected components over every import of the package."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for target, _ in GRAPH[name]:
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in on_stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == name:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in GRAPH:
        if name not in index:
            visit(name)
    assert not circles, f"import circles: {circles}"


@pytest.mark.parametrize("folder", sorted(LIMITS))
def test_no_module_past_the_line_limit(folder):
    long = {
        str(path.relative_to(ROOT)): lines
        for path in (ROOT / folder).rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > LIMITS[folder]
    }
    assert not long, f"modules over {LIMITS[folder]} lines in {folder}/: {long}"
