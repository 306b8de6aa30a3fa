"""One module knows the TVM release: only ``fold_guard/relax/_compat.py`` builds calls and
constants or reads source positions, and what it builds is what TVM's own constructors build.

    fold_guard/relax/**.py  ──grep──▶  relax.Call( / GenericConst( / .span / ty_args[0] only in _compat
    rebuild_call(call, args)  ==>  the op, attrs, type args and source position of call
    make_generic_const(v, ty) ==  relax.const(v)  (structurally)

So TVM 0.28's known changes (``loc`` for ``span``, ``ty`` for ``ret_ty``, keyword-only builders,
GenericConst's argument order: the module docstring cites apache/tvm main) are a change there.

White-box on purpose: it tests the TVM compatibility layer (``_compat``), a private mechanism.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from fold_guard.relax import _compat

ADAPTER = Path(_compat.__file__).parent
#: What only _compat may write: constructing a call or a GenericConst, reading a source
#: position, reading a call_tir's output type by index.
_RELEASE_SPECIFIC = re.compile(r"relax\.Call\(|GenericConst\(|\.span\b|\.loc\b|ty_args\[0\]")


def test_only_compat_builds_calls_and_reads_positions() -> None:
    found = {
        f"{path.relative_to(ADAPTER)}:{number}: {line.strip()}"
        for path in ADAPTER.rglob("*.py")
        if path.name != "_compat.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _RELEASE_SPECIFIC.search(line) and not line.lstrip().startswith(("#", ">>>"))
    }
    assert found == set()


def test_the_scan_sees_a_direct_construction() -> None:
    # Guards the pattern itself: the line the adapter used to have is found.
    assert _RELEASE_SPECIFIC.search(
        "return relax.Call(call.op, args, call.attrs, call.ty_args, call.span)"
    )


@I.ir_module
class _Module:
    @R.function
    def main(x: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
        y = R.add(x, x)
        return y


def _the_call() -> relax.Call:
    return _Module["main"].body.blocks[0].bindings[0].value


def test_rebuild_call_keeps_op_attrs_type_args_and_source_position() -> None:
    call = _the_call()
    other = relax.Var("z", relax.TensorType((2, 3), "float32"))
    rebuilt = _compat.rebuild_call(call, [other, other])
    assert rebuilt.op.same_as(call.op)
    assert list(rebuilt.args) == [other, other]
    # TVMScript records where each call was written: the rebuilt call keeps it.
    position = _compat.position_of(call)
    assert position is not None and _compat.position_of(rebuilt).same_as(position)


def test_make_call_with_a_result_type_has_that_type() -> None:
    call = _the_call()
    ty = _compat.type_of(call)
    made = _compat.make_call(call.op, list(call.args), call.attrs, call.ty_args, ty=ty)
    assert tvm_ffi.structural_equal(_compat.type_of(made), ty)


def test_make_generic_const_equals_relax_const() -> None:
    array = np.arange(6, dtype="int8").reshape(2, 3)
    expected = relax.const(array)
    made = _compat.make_generic_const(tvm.runtime.tensor(array), _compat.type_of(expected))
    tvm.ir.assert_structural_equal(made, expected)


def test_call_tir_output_type_is_what_legalization_declared() -> None:
    legalized = relax.transform.LegalizeOps()(_Module)
    call = legalized["main"].body.blocks[0].bindings[0].value
    assert call.op.same_as(tvm.ir.Op.get("relax.call_tir"))
    ty = _compat.call_tir_output_type(call)
    assert _compat.static_shape(ty) == (2, 3) and _compat.dtype_of(ty) == "float32"
