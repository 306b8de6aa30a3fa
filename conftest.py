"""Which of fold_guard's suites the installed TVM can run; what is left out is said, never hidden.

The two adapters need TVM builds that cannot share one environment:

- Relax: ``apache-tvm`` 0.27 (Python 3.11; ``.venv``, made by ``pip install -e ".[test]"``);
- Relay: a TVM build that still has ``tvm.relay`` (``hhb-tvm`` 3.2.3 = TVM 0.16 on Python 3.10;
  ``.venv310``, made from ``tests/relay/requirements.txt``).

``scripts/test.sh`` (what CI and the README run) runs each suite in its own environment and
checks beforehand that the environment has the TVM its suite needs, so a broken install fails
there instead of shrinking the suite. This file only keeps plain ``pytest`` working in either
environment: it leaves out the directories whose imports the installed TVM cannot satisfy
(collecting them would stop the run with ImportErrors) and names them, with the reason, in the
report header and again in the closing summary.

It lives at the repository root rather than in ``tests/`` because a conftest's collection hooks
apply only below it, and the adapters' doctests (``--doctest-modules`` over ``fold_guard/``)
must be left out too.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
from hypothesis import settings

#: The TVM release the Relax adapter and its tooling tests run on (the same pin as
#: ``fold_guard/relax/_compat.py``'s ``SUPPORTED_TVM`` and pyproject's apache-tvm dependency).
#: Kept separate from the adapter so that a bug in the adapter's own version check cannot make
#: its suite disappear.
RELAX_TVM: Tuple[int, int] = (0, 27)

#: Needs ``tvm.relay``: importing any of these on a TVM without Relay raises ImportError.
RELAY_ONLY: Tuple[str, ...] = (
    "tests/relay",
    "fold_guard/relay",
    "examples/_common/relay_byoc.py",
)
#: Needs TVM 0.27 (Relax) or the tools only the Relax environment installs from the ``test``
#: extra: mypy (test_typecheck), codespell (test_codespell), onnxruntime and Relax (test_examples),
#: Sphinx and the Relax API (test_docs).
RELAX_ONLY: Tuple[str, ...] = (
    "tests/relax",
    "fold_guard/relax",
    "examples/_common/relax_byoc.py",
    "examples/_common/relax_calls.py",
    "examples/_common/lowbit_llm.py",
    "tests/test_typecheck.py",
    "tests/test_codespell.py",
    "tests/test_examples.py",
    "tests/test_docs.py",
)


#: Hypothesis profiles, chosen with ``pytest --hypothesis-profile NAME`` (``support.profiles``
#: scales each property test's example count by the profile's ``max_examples`` per 100):
#: ``full`` draws every test's own count; ``ci`` (hypothesis's CI profile: derandomized, no
#: deadline, no example database; loaded by hypothesis itself when ``CI=true``) a quarter of it.
#: scripts/test.sh passes ``--hypothesis-profile=ci``; a later ``--hypothesis-profile=full``
#: among its pytest arguments gives the full counts.
settings.register_profile("full", settings.get_profile("default"), max_examples=100)
settings.register_profile("ci", settings.get_profile("ci"), max_examples=25)


def _installed_tvm() -> Tuple[Optional[str], bool]:
    """(``tvm.__version__`` or None when TVM is not installed, whether ``tvm.relay`` exists)."""
    if importlib.util.find_spec("tvm") is None:
        return None, False
    # Imported, not just located: an installed TVM that fails to import must stop the run here
    # rather than quietly count as "no TVM" and drop both adapter suites.
    import tvm

    return str(tvm.__version__), importlib.util.find_spec("tvm.relay") is not None


def _major_minor(version: str) -> Optional[Tuple[int, int]]:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def _left_out(version: Optional[str], has_relay: bool) -> Dict[str, str]:
    """Path (relative to the repository root) -> why this interpreter does not collect it."""
    left_out: Dict[str, str] = {}
    installed = "no TVM is installed" if version is None else f"tvm {version}"
    if not has_relay:
        why = (
            f"{installed} has no tvm.relay; the Relay suite runs in .venv310 (Python 3.10, hhb-tvm)"
        )
        left_out.update(dict.fromkeys(RELAY_ONLY, why))
    if version is None or _major_minor(version) != RELAX_TVM:
        why = (
            f"{installed} is not apache-tvm {RELAX_TVM[0]}.{RELAX_TVM[1]}; the Relax suite and the "
            "mypy/codespell/example checks run in .venv (Python 3.11, pip install -e '.[test]')"
        )
        left_out.update(dict.fromkeys(RELAX_ONLY, why))
    return left_out


ROOT = Path(__file__).resolve().parent
TVM_VERSION, HAS_RELAY = _installed_tvm()
LEFT_OUT: Dict[str, str] = _left_out(TVM_VERSION, HAS_RELAY)
_LEFT_OUT_PATHS: Tuple[Path, ...] = tuple(ROOT / path for path in LEFT_OUT)


def _is_left_out(path: Path) -> bool:
    path = path.resolve()
    return any(path == left or left in path.parents for left in _LEFT_OUT_PATHS)


#: fold_guard's persistent kernel cache (``fold_guard.relax._kernel_cache.CACHE_DIR_ENV``). The
#: suite runs with the cache on, so every equivalence test also checks the constants cached kernels
#: compute, but in a directory of its own: never the user's cache, and never one a previous run
#: filled (which could hide a kernel that no longer builds).
KERNEL_CACHE_ENV = "FOLD_GUARD_CACHE_DIR"
_session_cache: Optional[str] = None


def pytest_configure(config: pytest.Config) -> None:
    global _session_cache
    if KERNEL_CACHE_ENV not in os.environ:
        _session_cache = tempfile.mkdtemp(prefix="fold_guard-test-cache-")
        os.environ[KERNEL_CACHE_ENV] = _session_cache


def pytest_unconfigure(config: pytest.Config) -> None:
    if _session_cache is not None:
        shutil.rmtree(_session_cache, ignore_errors=True)
        os.environ.pop(KERNEL_CACHE_ENV, None)


def pytest_ignore_collect(collection_path: Path) -> Optional[bool]:
    # A hook rather than ``collect_ignore``: that list only matches the directory itself, so
    # ``pytest tests/relay`` named on the command line would still import every file below it.
    return True if _is_left_out(collection_path) else None


def _describe() -> List[str]:
    tvm_line = (
        "not installed"
        if TVM_VERSION is None
        else f"{TVM_VERSION} (tvm.relay: {'yes' if HAS_RELAY else 'no'})"
    )
    lines = [f"fold_guard: TVM {tvm_line}"]
    if not LEFT_OUT:
        lines.append("fold_guard: collecting every suite")
        return lines
    by_reason: Dict[str, List[str]] = {}
    for path, why in LEFT_OUT.items():
        by_reason.setdefault(why, []).append(path)
    for why, paths in by_reason.items():
        lines.append(f"fold_guard: not collected here: {', '.join(paths)} ({why})")
    return lines


def pytest_report_header() -> List[str]:
    return _describe()


#: pyproject's default selection (its addopts): plain ``pytest`` is the fast lane.
FAST_LANE = (
    "not slow and not stock and not model_explorer and not conformance and not model_zoo_large"
)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    deselected = len(terminalreporter.stats.get("deselected", []))
    if config.getoption("markexpr", "") == FAST_LANE and deselected:
        terminalreporter.write_line(
            f"fold_guard: fast lane ({deselected} deselected): tests marked slow, stock, "
            "model_explorer, conformance or model_zoo_large are left out; bash scripts/test.sh (the full lane) adds "
            "the slow ones, bash scripts/test.sh stock the stock canaries, -m '' selects every test"
        )
    # Repeated at the end: the header scrolls away, and a smaller count than expected should be
    # explained right where the count is printed.
    if not LEFT_OUT:
        return
    terminalreporter.write_sep("-", "fold_guard: suites for another TVM")
    for line in _describe():
        terminalreporter.write_line(line)
    # Asking for a left-out path by name and getting "no tests ran" deserves a louder note.
    asked = [arg for arg in config.args if _is_left_out(Path(arg.split("::")[0]))]
    if asked:
        terminalreporter.write_line(
            f"fold_guard: asked for {', '.join(asked)}, which this TVM cannot run; "
            "use that suite's environment (bash scripts/test.sh relax|relay)",
            red=True,
            bold=True,
        )


#: Parametrised tests whose size is part of what they check (a catalogue of kinds of bad input, a
#: corpus): test function -> the fewest cases it may have. Checked when the whole function is
#: collected, before any ``-m`` / ``-k`` selection, so a shrunken catalogue stops the run at
#: collection instead of passing quietly.
MIN_CASES: Dict[str, int] = {
    "tests/relax/test_bad_input_catalogue.py::test_bad_input": 30,
    "tests/relax/test_equivalence.py::test_corpus_well_formed_and_deterministic": 30,
    "tests/relay/test_bad_input_catalogue_relay.py::test_bad_input": 30,
    "tests/relay/test_corpus_stock.py::test_module_typed_and_deterministic": 26,
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    if any("::" in str(arg) for arg in config.args):
        return  # single tests asked for by node id: their functions are not collected whole
    counts: Dict[str, int] = {}
    for item in items:
        function = item.nodeid.split("[", 1)[0]
        if function in MIN_CASES:
            counts[function] = counts.get(function, 0) + 1
    short = {f: n for f, n in counts.items() if n < MIN_CASES[f]}
    if short:
        raise pytest.UsageError(
            "fold_guard: parametrised suites smaller than they must be (test: cases < minimum): "
            + ", ".join(f"{f}: {n} < {MIN_CASES[f]}" for f, n in sorted(short.items()))
        )
