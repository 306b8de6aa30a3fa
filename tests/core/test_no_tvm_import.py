"""The core and the top-level package import without TVM (STYLE item 1).

sys.modules["tvm"] = None  ==>  import fold_guard._core; import fold_guard   (no ImportError)

White-box on purpose: it tests the TVM-free core (``fold_guard._core``) directly, below the
adapters' public entry points.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_BLOCKED = ("tvm", "tvm_ffi", "tvm.relax", "tvm.relay")
#: Run from the repository root so the checkout, not whatever is installed, is imported.
_REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", ["fold_guard._core", "fold_guard"])
def test_imports_with_tvm_blocked(module):
    """A ``None`` entry in sys.modules makes any ``import tvm`` raise ImportError."""
    script = textwrap.dedent(
        f"""
        import sys
        for name in {_BLOCKED!r}:
            sys.modules[name] = None
        import {module} as mod
        assert mod.__file__ and mod.__file__.endswith("__init__.py"), mod  # not a namespace package
        assert mod.__all__
        from fold_guard._core import plan_folds, DEFAULT_POLICY, FoldGraph
        assert plan_folds(FoldGraph(()), DEFAULT_POLICY).decisions == ()
        loaded = sorted(name for name, m in sys.modules.items()
                        if m is not None and (name == "tvm" or name.startswith(("tvm.", "tvm_ffi"))))
        assert not loaded, loaded
        print("ok", mod.__name__)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=_REPO
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"ok {module}"


def test_blocking_really_blocks():
    """Guard against a vacuous test: with the block in place, ``import tvm`` itself fails."""
    script = 'import sys; sys.modules["tvm"] = None\ntry:\n    import tvm\nexcept ImportError:\n    print("blocked")'
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "blocked", result.stderr
