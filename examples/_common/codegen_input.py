"""The Relax module VM codegen receives: what a build keeps after its last Relax pass.

``tvm.compile`` runs the whole Relax pipeline before code generation and returns only the
executable. :func:`compile_with_codegen_input` builds with a pass instrument that keeps the module
after every pass that still has a Relax function, so the module it returns is the one the VM's
codegen compiled: its constants are the executable's, its ``vm.builtin`` calls the VM runs.
"""

from __future__ import annotations

from typing import Optional, Tuple

import tvm
from tvm import relax

__all__ = ["CodegenInput", "compile_with_codegen_input"]


@tvm.instrument.pass_instrument
class CodegenInput:
    """Keeps the module after each pass: after a build, the module VM codegen received."""

    def __init__(self) -> None:
        self.mod: Optional[tvm.IRModule] = None

    def run_after_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        if any(isinstance(func, relax.Function) for func in mod.functions.values()):
            self.mod = mod


def compile_with_codegen_input(
    mod: tvm.IRModule, target: str = "llvm"
) -> Tuple[tvm.runtime.Executable, tvm.IRModule]:
    """``tvm.compile(mod, target)`` and the module its VM codegen received."""
    instrument = CodegenInput()
    with tvm.transform.PassContext(instruments=[instrument]):
        exe = tvm.compile(mod, target=target)
    assert instrument.mod is not None, "the build ran no pass on a Relax module"
    return exe, instrument.mod
