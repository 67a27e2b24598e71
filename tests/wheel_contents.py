"""Check the built sdist and wheel against the source tree: ``python tests/wheel_contents.py dist``.

The tests run on an editable install, which reads the source tree; a user gets the wheel. This
script is what proves the two hold the same package (``make test-wheel``): every tracked file
under a directory ``pyproject.toml`` maps into the package is in the wheel under its import path
(or is a file ``package-data`` does not ship, which fails too: a template or a data file added
without its glob is exactly the file a user would miss), nothing else is (no stray top-level
``engine`` or ``integrations``), the package is marked typed (``py.typed``, PEP 561), the
metadata carries the version, the extras, the console script and the licence (``License-File``,
the file itself in the wheel and the sdist), and the sdist holds what the wheel is built from. It prints the wheel's file list.
Exit status 1 on any difference. setuptools has no such check of its own (``check-wheel-contents``
looks for common mistakes, not for this layout's mapping), hence this script.
"""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path, PurePosixPath

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def expected_wheel_files(pyproject: dict, tracked: list[str]) -> dict[str, str]:
    """Wheel path -> source path, for every tracked file the package mapping covers."""
    tool = pyproject["tool"]["setuptools"]
    packages: list[str] = tool["packages"]
    dirs: dict[str, str] = tool.get("package-dir", {})
    data: dict[str, list[str]] = tool.get("package-data", {})
    # Each package's source directory (package-dir, else the dotted path itself).
    source_dir = {p: dirs.get(p, p.replace(".", "/")) for p in packages}
    expected: dict[str, str] = {}
    for path in tracked:
        parent = str(PurePosixPath(path).parent)
        # The deepest package whose directory holds the file, however deep: a .py in an unlisted
        # sub-directory maps to a path the wheel lacks and is reported missing.
        owners = [p for p, d in source_dir.items() if parent == d or parent.startswith(d + "/")]
        if not owners:
            continue
        package = max(owners, key=lambda p: len(source_dir[p]))
        relative = PurePosixPath(path).relative_to(source_dir[package])
        target = str(PurePosixPath(package.replace(".", "/")) / relative)
        if path.endswith(".py") or any(
            fnmatch.fnmatch(str(relative), g) for g in data.get(package, [])
        ):
            expected[target] = path
        else:
            expected[f"(not shipped) {target}"] = path
    return expected


def check_wheel(wheel: Path, pyproject: dict, tracked: list[str]) -> list[str]:
    project = pyproject["project"]
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = f"{project['name'].replace('-', '_')}-{project['version']}.dist-info/"
    shipped = {n for n in names if not n.startswith(dist_info)}
    expected = expected_wheel_files(pyproject, tracked)
    problems = [
        f"missing from the wheel: {w} (source {s})"
        for w, s in sorted(expected.items())
        if w not in shipped
    ]
    problems += [
        f"in the wheel but not in the source mapping: {n}" for n in sorted(shipped - set(expected))
    ]
    if dist_info + "METADATA" not in names:
        return [
            *problems,
            f"no {dist_info}METADATA: the wheel's version is not {project['version']}",
        ]
    with zipfile.ZipFile(wheel) as z:
        metadata = Parser().parsestr(z.read(dist_info + "METADATA").decode())
        entry_points = z.read(dist_info + "entry_points.txt").decode()
    if metadata["Version"] != project["version"]:
        problems.append(f"METADATA Version {metadata['Version']} != pyproject {project['version']}")
    extras = set(metadata.get_all("Provides-Extra") or [])
    problems += [
        f"extra {e!r} not in METADATA" for e in project["optional-dependencies"] if e not in extras
    ]
    for script, target in project.get("scripts", {}).items():
        if f"{script} = {target}" not in entry_points:
            problems.append(f"console script {script} = {target} not in entry_points.txt")
    if "vllm_inline/py.typed" not in names:
        problems.append("no vllm_inline/py.typed: type checkers would treat the package as untyped")
    if metadata["License-Expression"] != project["license"]:
        problems.append(f"METADATA License-Expression is {metadata['License-Expression']!r}")
    for licence in project.get("license-files", []):
        if licence not in (metadata.get_all("License-File") or []):
            problems.append(f"METADATA has no License-File: {licence}")
        if f"{dist_info}licenses/{licence}" not in names:
            problems.append(f"the wheel does not carry {dist_info}licenses/{licence}")
    return problems


def check_sdist(sdist: Path, pyproject: dict, tracked: list[str]) -> list[str]:
    prefix = sdist.name.removesuffix(".tar.gz") + "/"
    with tarfile.open(sdist) as t:
        members = {m.name.removeprefix(prefix) for m in t.getmembers()}
    wanted = [
        "pyproject.toml",
        pyproject["project"]["readme"],
        *pyproject["project"]["license-files"],
    ]
    wanted += sorted(set(expected_wheel_files(pyproject, tracked).values()))
    return [f"missing from the sdist: {p}" for p in wanted if p not in members]


def main(dist: str) -> int:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    wheels, sdists = sorted(Path(dist).glob("*.whl")), sorted(Path(dist).glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        print(
            f"expected one wheel and one sdist in {dist}, found {wheels + sdists}", file=sys.stderr
        )
        return 1
    print(f"{wheels[0].name}:")
    for info in zipfile.ZipFile(wheels[0]).infolist():
        print(f"  {info.file_size:>8}  {info.filename}")
    problems = check_wheel(wheels[0], pyproject, tracked) + check_sdist(
        sdists[0], pyproject, tracked
    )
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    if not problems:
        print(
            f"{wheels[0].name} and {sdists[0].name} hold every mapped file, py.typed, the version, "
            "the extras, the console script and the licence"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "dist"))
