"""apache-tvm-tirx beside apache-tvm 0.27: one clear line, never an aborted interpreter.

apache/tvm's main branch moved TVM's core into apache-tvm-tirx (``tvm_tirx``). Importing it and
apache-tvm's ``tvm`` in one process aborts the interpreter (rc 134, "Global Function
`device_api.cpu` is already registered"). fold_guard (``fold_guard/_tvm/cores.py``):

    import tvm_tirx; import fold_guard          ==> one warning line, tvm never imported, rc 0
    import tvm_tirx; import fold_guard.relax    ==> UnsupportedIRError: that line, rc 1
    import fold_guard.relax; import tvm_tirx    ==> ImportError: the line, rc 1
    import fold_guard   (tirx installed only)   ==> one warning line naming both ffi pins
    import tvm; import tvm_tirx  (no fold_guard) ==> rc 134: the abort the guard prevents

The fast tests below check the messages and the import guard in this environment (no tirx
here). The slow one installs ``apache-tvm-tirx==0.1.0a4`` beside ``apache-tvm==0.27.0.post1`` in
a venv of its own (about 40 s from pip's cache) and runs each line above in a fresh interpreter.

White-box on purpose: it tests the guard against a second TVM core (``_tvm.cores``), a private
mechanism.
"""

from __future__ import annotations

import subprocess
import sys
import types
import venv
from pathlib import Path
from typing import Dict

import pytest
from support.checkout import copy_checkout

import fold_guard
from fold_guard._tvm import cores as _tvm_cores

TIRX = "0.1.0a4"
TVM = "0.27.0.post1"


def test_no_tirx_here_means_no_conflict() -> None:
    assert _tvm_cores.conflict() is None


def test_an_imported_tvm_tirx_stops_the_adapter_before_tvm(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tvm_tirx", types.ModuleType("tvm_tirx"))
    with pytest.raises(fold_guard.UnsupportedIRError) as raised:
        _tvm_cores.check_no_second_core()
    line = str(raised.value)
    assert "\n" not in line
    assert "tvm_tirx (apache-tvm-tirx (version unknown)) is imported in this process" in line
    assert "pip uninstall apache-tvm-tirx" in line


def test_importing_tvm_tirx_after_tvm_is_an_import_error_not_an_abort(monkeypatch) -> None:
    import tvm  # noqa: F401 - the Relax adapter's TVM is loaded, as after import fold_guard

    installed = {"apache-tvm-tirx": TIRX, "apache-tvm": TVM, "apache-tvm-ffi": "0.1.15.post2"}
    monkeypatch.setattr(_tvm_cores, "_version", installed.get)
    _tvm_cores.guard_tirx_import()
    sys.modules.pop("tvm_tirx", None)
    with pytest.raises(ImportError) as raised:
        import tvm_tirx  # noqa: F401
    assert "importing tvm_tirx now would abort the process" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_without_tirx_installed_its_import_fails_as_python_says() -> None:
    _tvm_cores.guard_tirx_import()
    sys.modules.pop("tvm_tirx", None)
    with pytest.raises(ModuleNotFoundError):
        import tvm_tirx  # noqa: F401


def _run(python: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300
    )


@pytest.fixture(scope="module")
def tirx_venv(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    """apache-tvm-tirx and apache-tvm 0.27 in one venv (pip resolves apache-tvm-ffi to tirx's
    0.1.15.x), fold_guard installed beside them with --no-deps, as a user who forces it would."""
    root = tmp_path_factory.mktemp("tirx")
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    source = copy_checkout(root / "fold_guard")
    for args in (
        [f"apache-tvm-tirx=={TIRX}", f"apache-tvm=={TVM}", "numpy", "typing-extensions", "tqdm"],
        ["--no-deps", str(source)],
    ):
        result = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--pre", *args],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert result.returncode == 0, result.stdout + result.stderr
    return {"python": python, "cwd": root}


@pytest.mark.slow
def test_two_tvm_cores_abort_without_fold_guard(tirx_venv) -> None:
    # The failure this guards against is real: no Python exception, the interpreter aborts.
    result = _run(tirx_venv["python"], "import tvm; import tvm_tirx", tirx_venv["cwd"])
    assert result.returncode == -6 or result.returncode == 134, result
    assert "device_api.cpu` is already registered" in result.stderr


@pytest.mark.slow
def test_import_fold_guard_next_to_imported_tirx_says_one_line(tirx_venv) -> None:
    code = (
        "import sys, tvm_tirx, fold_guard; "
        "print('tvm' in sys.modules, 'fold_guard.relax' in sys.modules, "
        "fold_guard.list_policies()[0].name)"
    )
    result = _run(tirx_venv["python"], code, tirx_venv["cwd"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "default"]
    (line,) = result.stderr.splitlines()
    assert (
        "TVMCoreConflictWarning: fold_guard: tvm_tirx (apache-tvm-tirx 0.1.0a4) is imported" in line
    )
    assert f"apache-tvm {TVM} cannot load beside it" in line
    assert line.endswith("pip uninstall apache-tvm-tirx in this one)")


@pytest.mark.slow
def test_import_fold_guard_relax_next_to_imported_tirx_is_refused(tirx_venv) -> None:
    code = (
        "import tvm_tirx, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "try:\n"
        "    import fold_guard.relax\n"
        "except ImportError as err:\n"
        "    raise SystemExit(f'ImportError {err}')\n"
        "except TypeError as err:\n"
        "    raise SystemExit(f'{type(err).__name__}: {err}')\n"
    )
    result = _run(tirx_venv["python"], code, tirx_venv["cwd"])
    assert result.returncode == 1, result
    assert result.stderr.startswith("UnsupportedIRError: fold_guard: tvm_tirx (apache-tvm-tirx")
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.slow
def test_import_tvm_tirx_after_fold_guard_is_an_import_error(tirx_venv) -> None:
    code = (
        "import warnings\n"
        "warnings.simplefilter('ignore')\n"
        "import fold_guard.relax\n"
        "try:\n"
        "    import tvm_tirx\n"
        "except ImportError as err:\n"
        "    raise SystemExit(f'ImportError: {err}')\n"
    )
    result = _run(tirx_venv["python"], code, tirx_venv["cwd"])
    assert result.returncode == 1, result
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"ImportError: fold_guard: apache-tvm-tirx {TIRX} is installed beside")
    assert "importing tvm_tirx now would abort the process" in line


@pytest.mark.slow
def test_tirx_installed_but_not_imported_is_one_warning_line(tirx_venv) -> None:
    result = _run(tirx_venv["python"], "import fold_guard.relax", tirx_venv["cwd"])
    assert result.returncode == 0, result.stderr
    (line,) = result.stderr.splitlines()
    assert f"apache-tvm-tirx {TIRX} is installed beside apache-tvm {TVM}" in line
    assert "tirx >=0.1.15.post1, fold_guard <0.1.15; installed 0.1.15" in line
