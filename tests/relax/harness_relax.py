"""Relax's side of :mod:`support.ir_harness`: ``RELAX``, what the shared checks need of the IR."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, List, Optional, Set, Tuple

import numpy as np
import tvm
import tvm_ffi
from _common import onnx_models
from golden import constant_operands
from support.ir_harness import Signature
from tvm import relax

import fold_guard.relax as fgr

__all__ = ["RELAX"]

_OPS = {
    "add": relax.op.add,
    "multiply": relax.op.multiply,
    "exp": relax.op.exp,
    "logical_or": relax.op.logical_or,
    "cast": relax.op.astype,
}


def _calls_of(value: relax.Expr) -> List[relax.Call]:
    found: List[relax.Call] = []
    relax.analysis.post_order_visit(
        value,
        lambda n: (
            found.append(n) if isinstance(n, relax.Call) and isinstance(n.op, tvm.ir.Op) else None
        ),
    )
    return found


class _Relax:
    api = fgr
    title = "Relax"
    barrier_op, allow_op = "relax.fold_barrier", "relax.fold_allow"
    creation_ops = frozenset({"relax.zeros", "relax.ones", "relax.full"})
    quantize_op, dequantize_op = "relax.quantize", "relax.dequantize"
    stock_policies: Tuple[str, ...] = ("default",)
    catalogue_constant = np.arange(4, dtype="float32")
    catalogue_dtypes = (
        "bool",
        "int8",
        "uint8",
        "int64",
        "float16",
        "float64",
        "bfloat16",
        "int4",
        "uint4",
        "float8_e4m3fn",
        "float8_e5m2",
    )
    function_hint = r"tvm.IRModule\(\{'main': func\}\)"
    exp_label = "lv = relax.exp"

    def module(self, body: Callable[[relax.Var], relax.Expr]) -> tvm.IRModule:
        """``main(x) = body(x)`` in one dataflow block."""
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType(self.catalogue_constant.shape, "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                out = bb.emit_output(body(x))
            bb.emit_func_output(out)
        return bb.get()

    def const(self, value: np.ndarray) -> relax.Constant:
        return relax.const(value)

    def op(self, name: str) -> Callable[..., relax.Expr]:
        return _OPS[name]

    def op_name(self, name: str) -> str:
        return f"relax.{name}"

    def assert_equal(self, got: tvm.IRModule, want: tvm.IRModule) -> None:
        tvm.ir.assert_structural_equal(got, want)

    def equal(self, a: tvm.IRModule, b: tvm.IRModule) -> bool:
        return bool(tvm_ffi.structural_equal(a, b))

    def stock_fold(self, mod: tvm.IRModule, policy: str = "default") -> tvm.IRModule:
        assert policy == "default", policy
        return relax.transform.FoldConstant()(mod)

    def reference_fold(self, mod: tvm.IRModule) -> Optional[Any]:
        return fgr.fold(mod, reference_engine=True)

    def op_names(self, mod: tvm.IRModule) -> List[str]:
        return [
            call.op.name
            for func in mod.functions.values()
            if isinstance(func, relax.Function)
            for call in _calls_of(func)
        ]

    def downstream_of_barriers(self, mod: tvm.IRModule) -> Counter:
        """Op calls bound in a binding that reads a barrier's output, directly or through other
        bindings (tuples and tuple items included), and the barriers themselves."""
        counts: Counter = Counter()
        for func in mod.functions.values():
            if not isinstance(func, relax.Function):
                continue
            down: Set[relax.Var] = set()
            for block in func.body.blocks:
                for binding in block.bindings:
                    value = binding.value
                    calls = _calls_of(value)
                    reads = relax.analysis.free_vars(value)
                    if any(c.op.name == self.barrier_op for c in calls) or any(
                        var in down for var in reads
                    ):
                        down.add(binding.var)
                        counts.update(c.op.name for c in calls)
        return counts

    def is_known_tvm_failure(self, err: Exception, spec: dict) -> bool:
        return False

    def run_both(
        self, unfolded: tvm.IRModule, folded: tvm.IRModule, spec: dict
    ) -> Tuple[List[np.ndarray], List[np.ndarray]]:
        """Both versions of every function compiled in one module (one compile)."""
        functions = {}
        for gvar, func in unfolded.functions.items():
            functions[gvar.name_hint] = func
            functions[f"{gvar.name_hint}_folded"] = folded[gvar.name_hint]
        functions = {name: f.with_attr("global_symbol", name) for name, f in functions.items()}
        vm = relax.VirtualMachine(tvm.compile(tvm.IRModule(functions), target="llvm"), tvm.cpu())
        x = tvm.runtime.tensor(
            np.random.default_rng(spec["seed"] + 1).standard_normal(spec["shape"]).astype("float32")
        )
        got: List[np.ndarray] = []
        want: List[np.ndarray] = []
        for gvar in unfolded.functions:
            want += [t.numpy() for t in vm[gvar.name_hint](x)]
            got += [t.numpy() for t in vm[f"{gvar.name_hint}_folded"](x)]
        return got, want

    def import_onnx(self, model: Any) -> tvm.IRModule:
        return onnx_models.import_relax(model)

    def constant_operands(self, mod: tvm.IRModule, op_name: str) -> List[Signature]:
        return constant_operands(mod, op_name)


RELAX = _Relax()
