"""RFC.md, guarantees 1, 2 and 4, on the unannotated corpus, default policy.

1. ``fold_guard.relax.FoldConstant()`` gives exactly the stock pass's output.
2. Folded constants are bit-identical to stock's, and a built module runs to the same output
   before and after our pass.
4. The input module is not mutated; the same input gives the same output.

The corpus itself (well-formedness, determinism, what stock does to each module) is checked
against the installed TVM by the tests that do not need fold_guard.

White-box on purpose: it tests the engine options as ``_config`` resolves them, a private
mechanism.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

try:
    from tests.relax.corpus import BUILDERS, NOT_RUNNABLE, STOCK
except ImportError:  # tests/ is not a package: pytest puts tests/relax on sys.path
    from corpus import BUILDERS, NOT_RUNNABLE, STOCK

NAMES = list(BUILDERS)


def _ours() -> tvm.transform.Pass:
    import fold_guard.relax

    return fold_guard.relax.FoldConstant()


def _stock() -> tvm.transform.Pass:
    return relax.transform.FoldConstant()


def _copy(mod: tvm.IRModule) -> tvm.IRModule:
    return tvm.ir.load_json(tvm.ir.save_json(mod))


# Stock's output and ours are computed once per corpus case and read by several tests. Each is
# computed from a module built for it alone, so no test can see another's (possibly mutated)
# input, and the tests only read them (a test that hands a module to more TVM passes, such as
# tvm.compile, hands over a copy).
_STOCK_OUT: dict[str, tvm.IRModule] = {}


def _stock_out(name: str) -> tvm.IRModule:
    if name not in _STOCK_OUT:
        _STOCK_OUT[name] = _stock()(BUILDERS[name]())
    return _STOCK_OUT[name]


@dataclass(frozen=True)
class _Folded:
    """One run of our pass: its fresh ``input`` (given to nothing else), a copy of the input
    taken before the pass (``saved``), and the ``output``."""

    input: tvm.IRModule
    saved: tvm.IRModule
    output: tvm.IRModule


_FOLDED: dict[str, _Folded] = {}


def _folded(name: str) -> _Folded:
    if name not in _FOLDED:
        mod = BUILDERS[name]()
        saved = _copy(mod)
        _FOLDED[name] = _Folded(mod, saved, _ours()(mod))
    return _FOLDED[name]


def _relax_functions(mod: tvm.IRModule):
    """(name, function) for every Relax function, sorted by name."""
    items = [(gv.name_hint, f) for gv, f in mod.functions.items() if isinstance(f, relax.Function)]
    return sorted(items, key=lambda it: it[0])


def _constants(mod: tvm.IRModule) -> list[tuple[str, np.ndarray]]:
    """Every tensor constant in the Relax functions of ``mod``, in a fixed order.

    Each entry is labelled ``function/binding-var#k`` (``function/<return>#k`` for the result
    expression), k counting constants inside that expression in post order.
    """
    found: list[tuple[str, np.ndarray]] = []

    def collect(label: str, expr) -> None:
        consts = []

        def visit(node):
            if isinstance(node, tvm.ir.GenericConst):
                consts.append(node)

        relax.analysis.post_order_visit(expr, visit)
        for k, c in enumerate(consts):
            found.append((f"{label}#{k}", c.value.numpy()))

    for fname, func in _relax_functions(mod):
        body = func.body
        for block in body.blocks:
            for binding in block.bindings:
                collect(f"{fname}/{binding.var.name}", binding.value)
        collect(f"{fname}/<return>", body.body)
    return found


def _is_known(expr) -> bool:
    """True for an expression whose value is known at compile time (no var, no call)."""
    if isinstance(expr, relax.Tuple):
        return all(_is_known(f) for f in expr.fields)
    if isinstance(expr, relax.ShapeExpr):  # R.shape([n, 8]) with symbolic n is not known
        return all(isinstance(getattr(v, "value", None), int) for v in expr.values)
    return not isinstance(
        expr, (relax.Var, relax.Call, relax.GlobalVar, relax.Function, relax.ExternFunc)
    )


def _is_impure_callee(op) -> bool:
    if isinstance(op, relax.ExternFunc):  # R.call_packed
        return True
    return isinstance(op, tvm.ir.Op) and op.get_attr("FPurity") is False


def _constant_only_bindings(mod: tvm.IRModule) -> list[str]:
    """Pure bindings left computing from known values only (calls on constants, getitems).

    Looks inside If branches and local functions too, as the stock pass does.
    """
    left: list[str] = []

    def scan(fname: str, seq: relax.SeqExpr) -> None:
        for block in seq.blocks:
            for binding in block.bindings:
                value = binding.value
                if isinstance(value, relax.If):
                    scan(fname, value.true_branch)
                    scan(fname, value.false_branch)
                elif isinstance(value, relax.Function):
                    scan(f"{fname}/{binding.var.name}", value.body)
                elif isinstance(value, relax.Call) and _is_impure_callee(value.op):
                    continue
                elif isinstance(value, relax.Call) and all(_is_known(a) for a in value.args):
                    left.append(f"{fname}/{binding.var.name}")
                elif isinstance(value, relax.TupleGetItem):
                    left.append(f"{fname}/{binding.var.name}")

    for fname, func in _relax_functions(mod):
        scan(fname, func.body)
    return left


# ---------------------------------------------------------------------------------------------
# The corpus against the installed TVM (no fold_guard needed)
# ---------------------------------------------------------------------------------------------


@pytest.mark.stock
@pytest.mark.parametrize("name", NAMES)
def test_corpus_well_formed_and_deterministic(name):
    mod = BUILDERS[name]()
    relax.analysis.well_formed(mod)  # 0.27: raises on violation, returns None
    assert relax.analysis.check_well_formed(mod)
    tvm.ir.assert_structural_equal(mod, BUILDERS[name]())
    tvm.ir.assert_structural_equal(mod, _copy(mod))


@pytest.mark.stock
@pytest.mark.parametrize("name", NAMES)
def test_stock_behaviour_as_recorded(name):
    """STOCK in corpus.py says what stock does; fail loudly if a TVM upgrade changes it."""
    mod = BUILDERS[name]()
    out = _stock_out(name)
    relax.analysis.well_formed(out)
    if STOCK[name] == "unchanged":
        tvm.ir.assert_structural_equal(out, mod)
        return
    assert not tvm_ffi.structural_equal(out, mod), f"{name}: stock no longer changes it"
    left = _constant_only_bindings(out)
    if STOCK[name] == "folds":
        assert not left, f"{name}: stock leaves constant-only bindings {left}"
    else:
        assert left, f"{name}: stock now folds every constant-only binding"


# ---------------------------------------------------------------------------------------------
# Guarantees
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_default_policy_matches_stock(name):
    tvm.ir.assert_structural_equal(_folded(name).output, _stock_out(name))


@pytest.mark.parametrize("name", NAMES)
def test_folded_constants_bit_identical(name):
    ours = _constants(_folded(name).output)
    stock = _constants(_stock_out(name))
    assert [label for label, _ in ours] == [label for label, _ in stock]
    for (label, a), (_, b) in zip(ours, stock):
        assert a.dtype == b.dtype, f"{name}: constant {label}: dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{name}: constant {label}: shape {a.shape} != {b.shape}"
        # Compare bytes, so that NaN payloads and -0.0 count too.
        assert a.tobytes() == b.tobytes(), f"{name}: constant {label} differs from stock"


@pytest.mark.parametrize("name", NAMES)
def test_a_warm_fold_matches_stock(name):
    """Folded again through the kernel cache the first fold filled: kernels loaded, not compiled,
    and requests read from their legalization records, not legalized (``_legalized``). The first
    fold is the one the tests above check (``_folded``), through the suite's kernel cache."""
    import fold_guard.relax
    from fold_guard.relax._config import resolve_options

    assert resolve_options().cache_dir is not None, "conftest.py turns the kernel cache on"
    _folded(name)
    warm = fold_guard.relax.fold(BUILDERS[name]())
    assert warm.report.kernels_compiled == 0
    tvm.ir.assert_structural_equal(warm.mod, _stock_out(name))


@pytest.mark.parametrize("name", NAMES)
def test_input_not_mutated(name):
    folded = _folded(name)  # the pass ran on folded.input, a module built for it alone
    mod, saved = folded.input, folded.saved
    tvm.ir.assert_structural_equal(mod, saved)
    tvm.ir.assert_structural_equal(mod, BUILDERS[name]())
    # The same input again, twice in a row: the same output each time.
    second = _ours()(mod)
    third = _ours()(mod)
    tvm.ir.assert_structural_equal(mod, saved)
    tvm.ir.assert_structural_equal(second, third)
    tvm.ir.assert_structural_equal(folded.output, second)


# ---------------------------------------------------------------------------------------------
# Numerics: build and run before and after
# ---------------------------------------------------------------------------------------------


def _static_tensor_params(mod: tvm.IRModule):
    """Shapes and dtypes of main's parameters, or None if one is not a static-shape tensor."""
    params = []
    for p in mod["main"].params:
        ty = p.ty
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            return None
        shape = []
        for dim in ty.shape.values:
            value = getattr(dim, "value", None)  # IntImm; a symbolic dim is a tirx.Var
            if not isinstance(value, int):
                return None
            shape.append(value)
        params.append((tuple(shape), str(ty.dtype)))
    return params


NUMERIC_NAMES = [
    n for n in NAMES if n not in NOT_RUNNABLE and _static_tensor_params(BUILDERS[n]()) is not None
]


def _inputs(params, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for shape, dtype in params:
        if dtype.startswith("float"):
            arrays.append(rng.uniform(-2.0, 2.0, size=shape).astype(dtype))
        elif dtype == "bool":
            arrays.append(rng.integers(0, 2, size=shape).astype(dtype))
        else:
            info = np.iinfo(dtype)
            lo, hi = max(int(info.min), -100), min(int(info.max), 100)
            arrays.append(rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype))
    return arrays


def _flatten(value) -> list[np.ndarray]:
    if hasattr(value, "numpy"):
        return [value.numpy()]
    if isinstance(value, (int, float, bool)):
        return [np.asarray(value)]
    return [a for item in value for a in _flatten(item)]


def _run(mod: tvm.IRModule, arrays: list[np.ndarray]) -> list[np.ndarray]:
    # tvm.compile's pipeline expects local functions lifted (VMShapeLower rejects them)
    exe = tvm.compile(relax.transform.LambdaLift()(mod), target="llvm")
    dev = tvm.runtime.cpu()
    vm = relax.VirtualMachine(exe, dev)
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    return _flatten(vm["main"](*args))


# Building and running takes about a second per module: the fast lane runs these few, the full
# lane every one.
FAST_NUMERIC = (
    "elemwise_chain_f32",
    "conv2d_weight_transforms",
    "qdq_weight_conv2d",
    "call_tir_in_dataflow",
)
assert set(FAST_NUMERIC) <= set(NUMERIC_NAMES)


@pytest.mark.parametrize(
    "name",
    [n if n in FAST_NUMERIC else pytest.param(n, marks=pytest.mark.slow) for n in NUMERIC_NAMES],
)
def test_numerics_before_after(name):
    mod = BUILDERS[name]()
    folded = _copy(_folded(name).output)
    arrays = _inputs(_static_tensor_params(mod), seed=NAMES.index(name))
    before = _run(mod, arrays)
    after = _run(folded, arrays)
    assert len(before) == len(after)
    for i, (b, a) in enumerate(zip(before, after)):
        assert b.dtype == a.dtype and b.shape == a.shape, f"{name}: output {i}"
        # Bit-identical, not just close: folding evaluates the same legalized kernels.
        assert b.tobytes() == a.tobytes(), (
            f"{name}: output {i} differs, max abs diff "
            f"{np.max(np.abs(b.astype('float64') - a.astype('float64')))}"
        )
