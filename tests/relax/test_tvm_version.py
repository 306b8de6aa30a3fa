"""A TVM release the Relax adapter does not know: a clear error, and the core still imports.

tvm.__version__ = "0.16.0"  ==>  import fold_guard          works (core only)
                                 import fold_guard.relax    UnsupportedIRError with an install hint
"""

import subprocess
import sys
import textwrap

import pytest


@pytest.mark.slow
def test_unknown_tvm_release_is_refused_clearly():
    script = textwrap.dedent(
        """
        import tvm
        tvm.__version__ = "0.16.0"   # e.g. a Relay build such as hhb-tvm
        import fold_guard
        assert "fold_guard.relax" not in __import__("sys").modules
        assert [p.name for p in fold_guard.list_policies()][:1] == ["default"]
        try:
            import fold_guard.relax
        except fold_guard.UnsupportedIRError as err:
            print("refused:", err)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert (
        "refused: fold_guard.relax supports apache-tvm 0.27.x, but tvm 0.16.0 is installed"
        in result.stdout
    )
    assert "pip install 'apache-tvm==0.27.0.post1'" in result.stdout


@pytest.mark.slow
def test_relay_adapter_is_refused_clearly_on_a_tvm_without_relay():
    """apache-tvm 0.27 has no Relay: importing fold_guard.relay names the TVM and what to install.

    import fold_guard.relay  (tvm 0.27)  ==>  UnsupportedIRError, nothing half-registered
    """
    script = textwrap.dedent(
        """
        import fold_guard
        try:
            import fold_guard.relay
        except fold_guard.UnsupportedIRError as err:
            print("refused:", err)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert (
        "refused: fold_guard.relay needs a TVM build with Relay (0.9 to 0.19); tvm 0.27"
        in result.stdout
    )
    assert "hhb-tvm==3.2.3" in result.stdout
