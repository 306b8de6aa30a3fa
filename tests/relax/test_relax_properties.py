"""Property tests on random small Relax modules with random ``fold_barrier`` placements.

Each module is a dataflow chain of exact elementwise ops over a few constants and one run-time
input ``x``; some results are wrapped in ``fold_barrier`` (and a few in ``fold_allow``), and every
value is returned so that nothing is dead code::

    c0, c1 = <const>, <const>
    v0 = add(c0, c1)          b0 = fold_barrier(v0)
    v1 = multiply(b0, c1)     # downstream of a barrier: must never fold
    v2 = subtract(x, v0)      # run-time
    return (v0, b0, v1, v2)

Properties (guarantees 3 and 4): after our pass, and after a later stock ``FoldConstant``, the
number of barriers is unchanged and everything downstream of a barrier is still a call; the input
is never mutated; the pass is deterministic and idempotent.
"""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.profiles import examples
from tvm import relax

import fold_guard.relax as fgr

SHAPE = (4,)
OPS = (relax.op.add, relax.op.multiply, relax.op.subtract, relax.op.maximum, relax.op.minimum)

# One step: (op index, left operand choice, right operand choice, wrap in barrier?, wrap in allow?)
_STEP = st.tuples(
    st.integers(0, len(OPS) - 1),
    st.integers(0, 1 << 16),
    st.integers(0, 1 << 16),
    st.booleans(),
    st.integers(0, 5),  # 0 means: wrap in fold_allow (about one step in six)
)
_MODULE = st.tuples(
    st.lists(
        st.lists(st.integers(-3, 3), min_size=4, max_size=4), min_size=1, max_size=3
    ),  # constants
    st.lists(_STEP, min_size=1, max_size=7),
)


def _build(spec):
    """Build the module; return it with the names of barriers and of values downstream of one."""
    constants, steps = spec
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    pool = [(relax.const(np.array(c, dtype="float32")), False) for c in constants] + [(x, False)]
    barriers, downstream, outputs = [], [], []
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            for k, (op, left, right, barrier, allow) in enumerate(steps):
                (a, a_tainted), (b, b_tainted) = pool[left % len(pool)], pool[right % len(pool)]
                tainted = a_tainted or b_tainted
                value = bb.emit(OPS[op](a, b), name_hint=f"v{k}")
                outputs.append(value)
                if tainted:
                    downstream.append(f"v{k}")
                if allow == 0:
                    value = bb.emit(fgr.fold_allow(value), name_hint=f"a{k}")
                    outputs.append(value)
                    if tainted:
                        downstream.append(f"a{k}")
                if barrier:
                    value = bb.emit(fgr.fold_barrier(value), name_hint=f"b{k}")
                    outputs.append(value)
                    barriers.append(f"b{k}")
                    tainted = True
                pool.append((value, tainted))
            result = bb.emit_output(relax.Tuple(outputs), name_hint="out")
        bb.emit_func_output(result)
    return bb.get(), barriers, downstream


def _count(mod, op_name):
    found = []

    def visit(node):
        if (
            isinstance(node, relax.Call)
            and isinstance(node.op, tvm.ir.Op)
            and node.op.name == op_name
        ):
            found.append(node)

    relax.analysis.post_order_visit(mod["main"], visit)
    return len(found)


def _bound_values(mod):
    return {b.var.name: b.value for block in mod["main"].body.blocks for b in block.bindings}


def _check_barriers_hold(mod, n_barriers, barriers, downstream, stage):
    assert _count(mod, "relax.fold_barrier") == n_barriers, stage
    values = _bound_values(mod)
    for name in barriers + downstream:
        assert name in values, f"{stage}: {name} was folded away"
        assert isinstance(values[name], relax.Call), (
            f"{stage}: {name} became {type(values[name]).__name__}"
        )
    for name in barriers:
        assert values[name].op.name == "relax.fold_barrier", stage


PASS = fgr.FoldConstant()


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_MODULE)
def test_random_barriers_hold_and_pass_is_pure(spec):
    mod, barriers, downstream = _build(spec)
    saved = tvm.ir.save_json(mod)
    n_barriers = _count(mod, "relax.fold_barrier")
    assert n_barriers == len(barriers)

    ours = PASS(mod)
    assert tvm.ir.save_json(mod) == saved, "the pass mutated its input"
    _check_barriers_hold(ours, n_barriers, barriers, downstream, "ours")

    # Guarantee 3: a later stock FoldConstant does not cross the barriers either.
    stock_after = relax.transform.FoldConstant()(ours)
    _check_barriers_hold(stock_after, n_barriers, barriers, downstream, "ours+stock")
    _check_barriers_hold(
        relax.transform.FoldConstant()(mod), n_barriers, barriers, downstream, "stock"
    )

    # Guarantee 4: deterministic, and idempotent on its own output.
    tvm.ir.assert_structural_equal(PASS(mod), ours)
    again = PASS(ours)
    tvm.ir.assert_structural_equal(again, ours)
    assert [n for n in _bound_values(again)] == [n for n in _bound_values(ours)]
    assert not fgr.fold(ours).modified
