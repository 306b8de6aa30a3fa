"""Relay's side of :mod:`support.ir_harness`: ``RELAY``, what the shared checks need of the IR."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
import tvm
from _common import onnx_models
from relay_ir import op_calls
from support.ir_harness import Signature
from tvm import relay
from tvm.contrib import graph_executor

import fold_guard.relay as fgr
from fold_guard.relay._stock import evaluation_target

__all__ = ["RELAY", "copy"]

_OPS = {
    "add": relay.add,
    "multiply": relay.multiply,
    "exp": relay.exp,
    "logical_or": relay.logical_or,
    "cast": relay.cast,
}


def copy(mod: tvm.IRModule) -> tvm.IRModule:
    """A copy for the stock passes and ``relay.build``, which write into what they are given."""
    return tvm.ir.load_json(tvm.ir.save_json(mod))


def _op_name(expr: relay.Expr) -> str:
    return expr.op.name if isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op) else ""


class _Relay:
    api = fgr
    title = "Relay"
    barrier_op, allow_op = "fold_barrier", "fold_allow"
    creation_ops = frozenset({"zeros", "ones", "full"})
    quantize_op, dequantize_op = "qnn.quantize", "qnn.dequantize"
    stock_policies: Tuple[str, ...] = ("default", "fold-qnn")
    catalogue_constant = np.arange(6, dtype="float32").reshape(2, 3)
    catalogue_dtypes = ("bool", "int8", "uint8", "int32", "int64", "float16", "float64", "bfloat16")
    function_hint = "fold_function"
    exp_label = "%0 = exp"

    def module(self, body: Callable[[relay.Var], relay.Expr]) -> tvm.IRModule:
        x = relay.var("x", shape=self.catalogue_constant.shape, dtype="float32")
        return tvm.IRModule.from_expr(relay.Function([x], body(x)))

    def const(self, value: np.ndarray) -> relay.Constant:
        return relay.const(value)

    def op(self, name: str) -> Callable[..., relay.Expr]:
        return _OPS[name]

    def op_name(self, name: str) -> str:
        return name

    def assert_equal(self, got: tvm.IRModule, want: tvm.IRModule) -> None:
        tvm.ir.assert_structural_equal(got, want, map_free_vars=True)

    def equal(self, a: tvm.IRModule, b: tvm.IRModule) -> bool:
        return bool(tvm.ir.structural_equal(a, b, map_free_vars=True))

    def stock_fold(self, mod: tvm.IRModule, policy: str = "default") -> tvm.IRModule:
        """``FoldConstant()``, or ``FoldConstant(fold_qnn=True)`` for ``fold-qnn``, on a typed copy."""
        assert policy in self.stock_policies, policy
        stock = relay.transform.FoldConstant(fold_qnn=policy == "fold-qnn")
        return stock(relay.transform.InferType()(copy(mod)))

    def reference_fold(self, mod: tvm.IRModule) -> Optional[Any]:
        return None  # the Relay adapter has one engine

    def op_names(self, mod: tvm.IRModule) -> List[str]:
        return [call.op.name for call in op_calls(mod)]

    def downstream_of_barriers(self, mod: tvm.IRModule) -> Counter:
        """Op calls that read a barrier, directly or through other calls (let-bound included)."""
        down: set = set()
        counts: Counter = Counter()
        let_of: dict = {}

        def visit(node: relay.Expr) -> None:
            if isinstance(node, relay.Let):
                let_of[node.var] = node.value
            if isinstance(node, relay.Call) and _op_name(node):
                reads = [let_of.get(arg, arg) for arg in node.args]
                reads = [
                    f for r in reads for f in (r.fields if isinstance(r, relay.Tuple) else [r])
                ]
                reads = [
                    let_of.get(r.tuple_value, r.tuple_value)
                    if isinstance(r, relay.TupleGetItem)
                    else r
                    for r in reads
                ]
                if _op_name(node) == self.barrier_op or any(r in down for r in reads):
                    down.add(node)
                    counts[_op_name(node)] += 1

        relay.analysis.post_order_visit(mod["main"], visit)
        return counts

    def is_known_tvm_failure(self, err: Exception, spec: dict) -> bool:
        """hhb's x86 ``dense`` schedule cannot compile a zero-size dense (autotvm's
        ``get_factors(0)`` raises), in the stock pass's evaluation and in ``relay.build`` alike."""
        return 0 in spec["shape"] and "reduce() of empty iterable" in str(err)

    def run_both(
        self, unfolded: tvm.IRModule, folded: tvm.IRModule, spec: dict
    ) -> Optional[Tuple[List[np.ndarray], List[np.ndarray]]]:
        try:
            want = _run(unfolded, spec)
        except Exception as err:  # noqa: BLE001 - checked: only the known TVM crash is accepted
            assert self.is_known_tvm_failure(err, spec), err
            return None  # no reference output to compare with
        return _run(folded, spec), want

    def import_onnx(self, model: Any) -> tvm.IRModule:
        return onnx_models.import_relay(model)

    def constant_operands(self, mod: tvm.IRModule, op_name: str) -> List[Signature]:
        return [
            (call.args[0].data.dtype, tuple(call.args[0].data.shape))
            for call in op_calls(mod["main"], op_name)
            if isinstance(call.args[0], relay.Constant)
        ]


def _run(mod: tvm.IRModule, spec: dict) -> List[np.ndarray]:
    """Build a copy in graph form (QNN canonicalization needs scales it can see as constants) at
    opt level 3 (as the other Relay build checks: QNN needs its canonicalization), run on the
    input ``spec`` seeds."""
    mod = relay.transform.ToGraphNormalForm()(copy(mod))
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=evaluation_target())
    runtime = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runtime.set_input(
        "x",
        np.random.default_rng(spec["seed"] + 1).standard_normal(spec["shape"]).astype("float32"),
    )
    runtime.run()
    return [runtime.get_output(i).numpy() for i in range(runtime.get_num_outputs())]


RELAY = _Relay()
