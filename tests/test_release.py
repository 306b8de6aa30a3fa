"""The release files: ``python -m build`` gives an sdist and a wheel that ``twine check`` passes,
with no packaging warning, and the wheel installs into a fresh venv whose ``fold-guard demo`` runs.

    checkout copy ──python -m build──▶ sdist + wheel   ==> no deprecation / warning in the log
                                                        ==> twine check --strict passes both
    sdist ──pip wheel (isolated build)──▶ a wheel with the same files as build's
    wheel[examples] ──pip install, fresh venv──▶ fold-guard demo  ==> exit 0, the demo's headline;
                                                        ==> pip printed no warning

The build runs without isolation (this environment's setuptools, which the ``test`` extra pins
to >= 77); the sdist's own build and the fresh venv's install use pip as a user's machine has
it (here: the local index beside PyPI's cache). Seconds to a minute each: slow.
"""

from __future__ import annotations

import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path
from typing import Dict

import pytest
from support.checkout import copy_checkout

from fold_guard import __version__

pytestmark = pytest.mark.slow

#: What setuptools, pip and twine say when something in the packaging is deprecated or wrong.
_WARNING = re.compile(r"deprecat|warning:|WARNING", re.I)
#: Lines that are not about the package: the machine's pip configuration (a missing local index
#: directory) and Python's byte-compiling switched off in this environment.
_NOT_OURS = re.compile(r"Location 'file:///opt/|byte-compiling is disabled")


def _warnings(log: str) -> list:
    return [
        line for line in log.splitlines() if _WARNING.search(line) and not _NOT_OURS.search(line)
    ]


def _run(args, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, timeout=900, **kwargs)
    assert result.returncode == 0, f"{args}:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, object]:
    source = copy_checkout(tmp_path_factory.mktemp("source") / "fold_guard")
    out = tmp_path_factory.mktemp("dist")
    result = _run([sys.executable, "-m", "build", "--no-isolation", "-o", str(out), str(source)])
    (sdist,) = out.glob("fold_guard-*.tar.gz")
    (wheel,) = out.glob("fold_guard-*.whl")
    return {"log": result.stdout + result.stderr, "sdist": sdist, "wheel": wheel}


def test_build_gives_an_sdist_and_a_wheel_of_this_version_without_warnings(built) -> None:
    assert Path(built["sdist"]).name == f"fold_guard-{__version__}.tar.gz"
    assert Path(built["wheel"]).name == f"fold_guard-{__version__}-py3-none-any.whl"
    assert _warnings(built["log"]) == []


def test_twine_check_passes_both(built) -> None:
    result = _run(
        [
            sys.executable,
            "-m",
            "twine",
            "check",
            "--strict",
            str(built["sdist"]),
            str(built["wheel"]),
        ]
    )
    assert result.stdout.count("PASSED") == 2, result.stdout


def test_the_metadata_names_the_license_as_spdx_with_its_file(built) -> None:
    with zipfile.ZipFile(built["wheel"]) as archive:
        names = archive.namelist()
        metadata = archive.read(
            next(n for n in names if n.endswith(".dist-info/METADATA"))
        ).decode()
        license_text = archive.read(next(n for n in names if n.endswith("/licenses/LICENSE")))
    assert "License-Expression: Apache-2.0" in metadata
    assert "License-File: LICENSE" in metadata
    # PEP 639: no license classifier beside an SPDX expression.
    assert "Classifier: License ::" not in metadata
    assert b"Apache License" in license_text and b"Version 2.0, January 2004" in license_text


def test_the_sdist_builds_the_same_wheel_in_an_isolated_build(built, tmp_path: Path) -> None:
    result = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-w",
            str(tmp_path),
            str(built["sdist"]),
        ]
    )
    assert _warnings(result.stdout + result.stderr) == []
    (rebuilt,) = tmp_path.glob("fold_guard-*.whl")
    with zipfile.ZipFile(built["wheel"]) as one, zipfile.ZipFile(rebuilt) as other:
        assert sorted(one.namelist()) == sorted(other.namelist())


def test_the_wheel_installs_in_a_fresh_venv_and_runs_the_demo(built, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # The demo builds its QDQ model with onnx: the examples extra, as the command's hint says.
    install = _run([str(python), "-m", "pip", "install", "-q", f"{built['wheel']}[examples]"])
    assert _warnings(install.stdout + install.stderr) == []
    demo = _run([str(env_dir / "bin" / "fold-guard"), "demo"], cwd=tmp_path)
    assert "policy 'keep-qdq-weights'" in demo.stdout
    assert "keep-dequantize-of-integer-constant: kept 10" in demo.stdout
    # The installed package is the wheel's, not this checkout's.
    where = _run([str(python), "-c", "import fold_guard; print(fold_guard.__file__)"], cwd=tmp_path)
    assert str(env_dir) in where.stdout
