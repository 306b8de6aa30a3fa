"""Stock's per-call rules live in one function per IR, asked once per call (RFC.md, "Agreeing with
the stock pass").

    walk: every call binding --> _stock.stock_rules(call, ...) --> StockDecision(kind, reason, rule)
                                 (once per call; annotations are fold_guard's, never asked)

White-box on purpose: the walk's calls of ``fold_guard.relax._stock.stock_rules`` are counted, and
the adapters' source is read to check that no other module decides a stock rule: ``_stock``'s
docstring says its rules are "stated here and nowhere else", and these tests keep that true.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
import tvm
from corpus import corpus
from tvm import relax
from tvm.relax.expr_functor import PyExprVisitor, visitor
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import fold_guard.relax as fgr
from fold_guard import Reason
from fold_guard.relax import _stock, _translate
from fold_guard.relax._sites import SiteKind
from fold_guard.relax._translate import walk

PACKAGE = Path(fgr.__file__).resolve().parents[1]
ANNOTATIONS = ("relax.fold_barrier", "relax.fold_allow")


@visitor
class _CallBindings(PyExprVisitor):
    """Every call binding of a function, nested functions and If branches included."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: List[relax.Call] = []

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        if isinstance(value, relax.Call):
            op = value.op
            if not (isinstance(op, tvm.ir.Op) and op.name in ANNOTATIONS):
                self.calls.append(value)
        super().visit_var_binding_(binding)


def _asked(monkeypatch: pytest.MonkeyPatch, mod: tvm.IRModule) -> Dict[str, object]:
    asked: List[relax.Call] = []
    real = walk.stock_rules

    def counting(call: relax.Call, **kwargs: object) -> _stock.StockDecision:
        asked.append(call)
        return real(call, **kwargs)

    monkeypatch.setattr(walk, "stock_rules", counting)
    analysis = _translate.analyse(mod, "default")
    monkeypatch.setattr(walk, "stock_rules", real)
    bindings = _CallBindings()
    for func in analysis.mod.functions.values():
        if isinstance(func, relax.Function):
            bindings.visit_expr(func)
    return {"asked": asked, "calls": bindings.calls, "analysis": analysis}


@pytest.mark.parametrize("name, mod", corpus(), ids=[name for name, _ in corpus()])
def test_the_walk_asks_stock_rules_once_per_call(monkeypatch, name, mod):
    seen = _asked(monkeypatch, mod)
    asked, calls = seen["asked"], seen["calls"]
    assert len(asked) == len(calls)
    assert sorted(c.__chandle__() for c in asked) == sorted(c.__chandle__() for c in calls)


def test_annotations_are_never_asked(monkeypatch):
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            w = bb.emit(relax.op.exp(relax.const(np.zeros(2, "float32"))))
            b = bb.emit(fgr.fold_barrier(w))
            a = bb.emit(fgr.fold_allow(relax.op.negative(b)))
            y = bb.emit_output(relax.op.add(x, a))
        bb.emit_func_output(y)
    seen = _asked(monkeypatch, bb.get())
    assert [c.op.name for c in seen["asked"]] == ["relax.exp", "relax.negative", "relax.add"]
    kinds = [site.kind for site in seen["analysis"].translation.sites]
    assert SiteKind.BARRIER in kinds and SiteKind.ALLOW in kinds


@I.ir_module
class _Rules:
    @T.prim_func(s_tir=True)
    def add_one(a: T.Buffer((4,), "float32"), out: T.Buffer((4,), "float32")):
        for i in range(4):
            with T.sblock("add"):
                vi = T.axis.spatial(4, i)
                out[vi] = a[vi] + T.float32(1)

    @R.function
    def inner(v: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        return v

    @R.function
    def main(x: R.Tensor(("n",), "float32")):
        cls = _Rules
        c = R.const(np.ones(4, "float32"))
        with R.dataflow():
            lv0 = R.exp(c)  # an operator with a kernel, in a dataflow block: stock folds it
            lv1 = cls.inner(c)  # not an operator
            lv2 = R.cumsum(c, axis=0)  # no FLegalize
            lv3 = R.call_tir(cls.add_one, (c,), out_ty=R.Tensor((4,), "float32"))
            lv4 = R.exp(x)  # a result of symbolic dims
            lv5 = R.tensor_to_shape(R.const(np.ones(2, "int32")))  # not int64
            lv6 = R.zeros((64, 64), "float32")  # a large creation
            R.output(lv0, lv1, lv2, lv3, lv4, lv5, lv6)
        lv7 = R.exp(c)  # outside a dataflow block
        return (lv0, lv1, lv2, lv3, lv4, lv5, lv6, lv7)


#: label -> (kind, unfoldable, detail's start, default_fold, default_rule's start)
EXPECTED = {
    "lv0": (SiteKind.OP, None, "", True, ""),
    "lv1": (SiteKind.OTHER, Reason.UNSUPPORTED, "call to", True, ""),
    "lv2": (SiteKind.OTHER, Reason.UNSUPPORTED, "relax.cumsum has no FLegalize", True, ""),
    "lv3": (SiteKind.CALL_TIR, None, "", True, ""),
    "lv4": (SiteKind.OP, Reason.DYNAMIC_SHAPE, "result type", True, ""),
    "lv5": (SiteKind.TENSOR_TO_SHAPE, Reason.UNSUPPORTED, "tensor_to_shape folds only", True, ""),
    "lv6": (SiteKind.OP, None, "", False, _stock.RULE_LARGE_CREATION),
    "lv7": (SiteKind.OP, None, "", False, _stock.RULE_DATAFLOW_ONLY),
}


def test_each_rule_answers_with_its_reason():
    """Each guard of ``stock_rules``, in ``fold_constant.cc``'s order, as the walk records it."""
    translation = _translate.analyse(_Rules, "default").translation
    by_label = {
        node.label: (node, site) for node, site in zip(translation.nodes, translation.sites)
    }
    for label, (kind, unfoldable, detail, default_fold, rule) in EXPECTED.items():
        node, site = by_label[label]
        assert site.kind is kind, label
        assert node.unfoldable is unfoldable, label
        assert node.unfoldable_detail.startswith(detail), label
        assert (node.default_fold, node.default_rule.startswith(rule)) == (default_fold, True), (
            label
        )


def test_the_tir_vars_rule_is_written_once():
    """A ``call_tir`` passing symbolic shape values: one predicate and one text for the module's
    own call_tir and for a legalized one."""
    source = (PACKAGE / "relax" / "_stock.py").read_text()
    assert source.count("len(call.args) > 2") == 1
    assert source.count('"call_tir passes symbolic shape values (tir_vars)"') == 1


def _code_of(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@pytest.mark.parametrize("adapter", ["relax", "relay"])
def test_no_other_module_decides_a_stock_rule(adapter):
    """Outside ``_stock.py``: no read of the op attributes stock's rules look at, no reason only
    a stock rule gives, and one call of ``stock_rules``, by the walk."""
    stock_attrs = {
        "FLegalize",
        "FPurity",
        "TOpIsStateful",
        "TNonComputational",
        "FTVMQnnCanonicalize",
    }
    stock_reasons = {"IMPURE", "DYNAMIC_SHAPE"}
    callers = []
    for path in sorted((PACKAGE / adapter).rglob("*.py")):
        if path.name == "_stock.py":
            continue
        where = str(path.relative_to(PACKAGE))
        for node in ast.walk(_code_of(path)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get_attr":
                keys = [a.value for a in node.args if isinstance(a, ast.Constant)]
                assert not set(keys) & stock_attrs, where
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id == "stock_rules":
                    callers.append(where)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "Reason":
                    assert node.attr not in stock_reasons, f"{where}: Reason.{node.attr}"
    assert callers == [f"{adapter}/_translate/walk.py"]


def _module_strings(tree: ast.Module) -> Dict[str, str]:
    """The module-level names bound to a string (or a parenthesised concatenation of strings)."""
    found: Dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    continue
                if isinstance(value, str):
                    found[target.id] = value
    return found


@pytest.mark.parametrize("adapter", ["relax", "relay"])
def test_the_stock_rule_texts_are_stated_in_stock_alone(adapter):
    """Every rule constant (``RULE_*``, ``*_RULE``) of an adapter is defined in its ``_stock.py``,
    and no other module of the adapter spells a stock rule's text or starts a text with the IR's
    rule prefix (``relax: ``), so ``_stock``'s "stated here and nowhere else" stays true."""
    stock = _module_strings(_code_of(PACKAGE / adapter / "_stock.py"))
    texts = {text for name, text in stock.items() if "RULE" in name}
    assert texts, "the stock module defines its rule texts"
    for path in sorted((PACKAGE / adapter).rglob("*.py")):
        if path.name == "_stock.py":
            continue
        where = str(path.relative_to(PACKAGE))
        names = _module_strings(_code_of(path))
        assert not [n for n in names if n.startswith("RULE_") or n.endswith("_RULE")], where
        for node in ast.walk(_code_of(path)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in texts, f"{where}: {node.value!r}"
                assert not node.value.startswith(f"{adapter}: "), f"{where}: {node.value!r}"
