"""Spelling in code and docs is checked like any other test (style guide item 11)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_codespell_finds_no_misspelling() -> None:
    codespell = shutil.which("codespell") or str(Path(sys.executable).with_name("codespell"))
    if not Path(codespell).exists():
        pytest.fail("codespell is not installed: install the test extra, pip install -e '.[test]'")
    targets = [
        str(ROOT / name)
        for name in (
            "fold_guard",
            "tests",
            "examples",
            "bench",
            "docs",
            "README.md",
            "RFC.md",
            "CHANGELOG.md",
        )
        if (ROOT / name).exists()
    ]
    result = subprocess.run([codespell, *targets], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
