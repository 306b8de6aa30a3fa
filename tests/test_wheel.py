"""The built wheel holds the package and the command's launcher, nothing else: no fixtures, no tests, no examples.

The models and backends the examples, benchmarks and tests share live in ``examples/_common`` and
``tests/support``, outside ``fold_guard/``; this builds the wheel the way ``pip install .`` would
(offline: ``--no-build-isolation`` uses the build-system's setuptools from this environment, the
``test`` extra installs it) from a copy of the checkout, and checks its file list.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from typing import Iterator

import pytest
from support.checkout import ROOT, copy_checkout

#: Modules the installed package must never import: the fixtures (``_common``, ``support``) and
#: packages that are test or example dependencies only.
_NOT_DEPENDENCIES = {
    "_common",
    "support",
    "tests",
    "examples",
    "onnxruntime",
    "pytest",
    "hypothesis",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    source = copy_checkout(tmp_path_factory.mktemp("source") / "fold_guard")
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (built,) = out.glob("fold_guard-*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


@pytest.mark.slow
def test_wheel_holds_the_package_files_and_nothing_else(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    dist_info = {name for name in names if name.split("/")[0].endswith(".dist-info")}
    package = sorted(set(names) - dist_info)
    expected = sorted(
        [path.relative_to(ROOT).as_posix() for path in (ROOT / "fold_guard").rglob("*.py")]
        + [path.relative_to(ROOT).as_posix() for path in (ROOT / "fold_guard").rglob("*.json")]
        + ["_fold_guard_cli.py"]
    )
    assert package == expected
    assert not any(name.startswith("fold_guard/testing/") for name in names)
    metadata = {name.split("/", 1)[1] for name in dist_info}
    assert {"METADATA", "WHEEL", "RECORD", "entry_points.txt", "top_level.txt"} <= metadata
    assert wheel.read(
        next(n for n in dist_info if n.endswith("/top_level.txt"))
    ).decode().split() == ["_fold_guard_cli", "fold_guard"]
    # The console script's launcher lives outside the package (--help without importing TVM).
    assert (
        "fold-guard = _fold_guard_cli:main"
        in wheel.read(next(n for n in dist_info if n.endswith("/entry_points.txt"))).decode()
    )


@pytest.mark.slow
def test_wheel_modules_import_no_fixture_and_no_test_dependency(wheel: zipfile.ZipFile) -> None:
    imported = {}
    for name in wheel.namelist():
        if name.endswith(".py"):
            for node in ast.walk(ast.parse(wheel.read(name), name)):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    imported.setdefault(module.split(".")[0], set()).add(name)
    assert (
        "numpy" in imported
    )  # the walk saw the imports (numpy is a dependency every adapter uses)
    assert {
        module: sorted(files) for module, files in imported.items() if module in _NOT_DEPENDENCIES
    } == {}
