"""The Relay equivalence corpus against the installed TVM, without fold_guard.

Checks that every corpus module is well typed and deterministic, that stock
``relay.transform.FoldConstant()`` and ``FoldConstant(fold_qnn=True)`` do to it exactly what
``corpus.STOCK`` records (changed or not, and which op calls are left), and that every runnable
module builds and runs on the CPU to the same output before and after the stock pass. These
facts are what ``test_equivalence.py`` holds fold_guard to, so they are pinned here first.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import relay

try:
    from tests.relay.corpus import (
        BUILDERS,
        EXECUTOR,
        NOT_BIT_EXACT,
        NOT_RUNNABLE,
        STOCK,
        STOCK_MUTATES_INPUT,
        make_inputs,
        op_counts,
        run_module,
    )
except ImportError:  # tests/ is not a package: pytest puts tests/relay on sys.path
    from corpus import (  # type: ignore[no-redef]
        BUILDERS,
        EXECUTOR,
        NOT_BIT_EXACT,
        NOT_RUNNABLE,
        STOCK,
        STOCK_MUTATES_INPUT,
        make_inputs,
        op_counts,
        run_module,
    )

# Every test here checks TVM (and the corpus's record of it), not fold_guard: full lane only.
pytestmark = pytest.mark.stock

NAMES = list(BUILDERS)
RUNNABLE = [name for name in NAMES if name not in NOT_RUNNABLE]
QNN_OPS = {"qnn.quantize", "qnn.dequantize", "qnn.requantize", "qnn.add", "qnn.conv2d", "qnn.dense"}


def _copy(mod: tvm.IRModule) -> tvm.IRModule:
    return tvm.ir.load_json(tvm.ir.save_json(mod))


def _stock(name: str, fold_qnn: bool) -> tvm.IRModule:
    return relay.transform.FoldConstant(fold_qnn=fold_qnn)(BUILDERS[name]())


def _has_dynamic_shape(mod: tvm.IRModule) -> bool:
    found: list[bool] = []

    def visit(node: object) -> None:
        if isinstance(node, (relay.Var, relay.Call)):
            ty = node.checked_type
            if isinstance(ty, relay.TensorType) and any(
                isinstance(d, tvm.tir.Any) for d in ty.shape
            ):
                found.append(True)

    for func in mod.functions.values():
        if isinstance(func, relay.Function):
            relay.analysis.post_order_visit(func, visit)
    return bool(found)


def _has_control_flow_or_calls(mod: tvm.IRModule) -> bool:
    """If, Let, a call to a non-primitive function, or more than one global function."""
    found: list[bool] = []

    def is_closure_call(node: object) -> bool:
        if not isinstance(node, relay.Call):
            return False
        callee = node.op
        if isinstance(callee, relay.Function):  # a Primitive=1 function runs like an op
            return not callee.attrs or "Primitive" not in callee.attrs
        return isinstance(callee, (relay.GlobalVar, relay.Var))

    def visit(node: object) -> None:
        if isinstance(node, (relay.If, relay.Let)) or is_closure_call(node):
            found.append(True)

    relay.analysis.post_order_visit(mod["main"], visit)
    return bool(found) or len(mod.functions) > 1


def _assert_same_outputs(
    name: str, expected: list[np.ndarray], got: list[np.ndarray], *, exact: bool
) -> None:
    assert len(expected) == len(got), f"{name}: {len(expected)} outputs before, {len(got)} after"
    for i, (want, have) in enumerate(zip(expected, got)):
        assert want.dtype == have.dtype and want.shape == have.shape, f"{name} output {i}"
        if exact:
            np.testing.assert_array_equal(have, want, err_msg=f"{name} output {i}")
        else:
            np.testing.assert_allclose(
                have, want, rtol=1e-6, atol=1e-6, err_msg=f"{name} output {i}"
            )


# ---------------------------------------------------------------------------------------------
# The corpus itself
# ---------------------------------------------------------------------------------------------


def test_corpus_tables():
    assert set(STOCK) == set(BUILDERS) == set(EXECUTOR)
    assert set(NOT_RUNNABLE) <= set(BUILDERS)
    assert set(NOT_BIT_EXACT) <= set(RUNNABLE)
    # the corpus must exercise both outcomes of both settings, and QNN-only differences
    assert {r.default for r in STOCK.values()} == {"changes", "unchanged"}
    assert {r.fold_qnn for r in STOCK.values()} == {"changes", "unchanged"}
    assert any(r.default == "unchanged" and r.fold_qnn == "changes" for r in STOCK.values())


@pytest.mark.parametrize("name", NAMES)
def test_module_typed_and_deterministic(name: str):
    mod = BUILDERS[name]()
    assert isinstance(mod, tvm.IRModule) and "main" in [
        gv.name_hint for gv in mod.get_global_vars()
    ]
    for func in mod.functions.values():
        assert func.checked_type is not None  # InferType ran
    # type checking again changes nothing, and builders are deterministic
    tvm.ir.assert_structural_equal(relay.transform.InferType()(mod), mod, map_free_vars=True)
    tvm.ir.assert_structural_equal(BUILDERS[name](), mod, map_free_vars=True)
    tvm.ir.assert_structural_equal(_copy(mod), mod)
    inputs, again = make_inputs(name, mod), make_inputs(name, BUILDERS[name]())
    assert inputs.keys() == again.keys()
    for key in inputs:
        np.testing.assert_array_equal(inputs[key], again[key])


@pytest.mark.parametrize("name", NAMES)
def test_executor_choice(name: str):
    """The graph executor gets only static, straight-line, single-function modules."""
    mod = BUILDERS[name]()
    if EXECUTOR[name] == "graph":
        assert not _has_dynamic_shape(mod), f"{name} has a relay.Any shape: use the VM"
        assert not _has_control_flow_or_calls(mod) or name in NOT_RUNNABLE, f"{name}: use the VM"
    else:
        assert _has_dynamic_shape(mod) or _has_control_flow_or_calls(mod), (
            f"{name}: use the graph executor"
        )


# ---------------------------------------------------------------------------------------------
# What stock FoldConstant does
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fold_qnn", [False, True], ids=["default", "fold_qnn"])
@pytest.mark.parametrize("name", NAMES)
def test_stock_record(name: str, fold_qnn: bool):
    record = STOCK[name]
    before = BUILDERS[name]()
    after = relay.transform.FoldConstant(fold_qnn=fold_qnn)(BUILDERS[name]())
    changed = not tvm.ir.structural_equal(after, before, map_free_vars=True)
    expected_change = record.fold_qnn if fold_qnn else record.default
    assert ("changes" if changed else "unchanged") == expected_change, after.astext(
        show_meta_data=False
    )
    expected_ops = record.ops_fold_qnn if fold_qnn else record.ops_default
    assert op_counts(after) == expected_ops, after.astext(show_meta_data=False)
    # stock's output type-checks and is stable under a second run
    tvm.ir.assert_structural_equal(relay.transform.InferType()(after), after, map_free_vars=True)
    tvm.ir.assert_structural_equal(
        relay.transform.FoldConstant(fold_qnn=fold_qnn)(after), after, map_free_vars=True
    )


@pytest.mark.parametrize("name", NAMES)
def test_stock_qnn_rules(name: str):
    """fold_qnn=True folds a superset of the default; without fold_qnn every QNN call stays."""
    before = op_counts(BUILDERS[name]())
    record = STOCK[name]
    for op in QNN_OPS:
        assert record.ops_default.get(op, 0) == before.get(op, 0), f"{name}: default folded {op}"
        assert record.ops_fold_qnn.get(op, 0) <= record.ops_default.get(op, 0)
    if record.default == "changes":
        assert record.fold_qnn == "changes"
    if not QNN_OPS & set(before):
        assert record.ops_fold_qnn == record.ops_default and record.fold_qnn == record.default


@pytest.mark.parametrize("fold_qnn", [False, True], ids=["default", "fold_qnn"])
def test_stock_input_mutation(fold_qnn: bool):
    """Stock leaves its input alone, except for the cases STOCK_MUTATES_INPUT records.

    Those are a stock bug (qnn.requantize attrs rewritten in place when fold_qnn evaluates it);
    pinning them here keeps the table honest and shows what fold_guard must not do.
    """
    mutated = []
    for name in NAMES:
        mod = BUILDERS[name]()
        copy = _copy(mod)
        relay.transform.FoldConstant(fold_qnn=fold_qnn)(mod)
        if not tvm.ir.structural_equal(mod, copy):
            mutated.append(name)
    assert sorted(mutated) == (sorted(STOCK_MUTATES_INPUT) if fold_qnn else [])


# ---------------------------------------------------------------------------------------------
# The corpus runs, to the same output before and after stock FoldConstant
# ---------------------------------------------------------------------------------------------

_UNFOLDED: dict[str, list[np.ndarray]] = {}


def _unfolded_outputs(name: str) -> list[np.ndarray]:
    if name not in _UNFOLDED:
        _UNFOLDED[name] = run_module(name, BUILDERS[name]())
    return _UNFOLDED[name]


@pytest.mark.parametrize("name", RUNNABLE)
def test_stock_folded_runs_same(name: str):
    expected = _unfolded_outputs(name)
    exact = name not in NOT_BIT_EXACT
    folded = run_module(name, _stock(name, fold_qnn=False))
    _assert_same_outputs(name, expected, folded, exact=exact)
    if STOCK[name].ops_fold_qnn != STOCK[name].ops_default:
        _assert_same_outputs(
            name, expected, run_module(name, _stock(name, fold_qnn=True)), exact=exact
        )


@pytest.mark.parametrize("name", sorted(NOT_BIT_EXACT))
def test_not_bit_exact_is_real(name: str):
    """The entries of NOT_BIT_EXACT do differ bit-wise (so the table cannot go stale)."""
    folded = run_module(name, _stock(name, fold_qnn=False))
    assert any(not np.array_equal(a, b) for a, b in zip(_unfolded_outputs(name), folded))


@pytest.mark.parametrize("name", sorted(NOT_RUNNABLE))
def test_not_runnable_is_real(name: str):
    """The entries of NOT_RUNNABLE do fail to build or run here, for the reason given."""
    with pytest.raises(ValueError, match="cannot be run here"):
        run_module(name, BUILDERS[name]())
    error_text = re.search(r"\(error: (.*)\)$", NOT_RUNNABLE[name])
    assert error_text, f"NOT_RUNNABLE[{name!r}] must end with '(error: <message>)'"
    with pytest.raises(tvm.TVMError, match=re.escape(error_text.group(1))):
        run_module(name, BUILDERS[name](), force=True)
