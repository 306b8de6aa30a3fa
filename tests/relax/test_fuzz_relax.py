"""Fuzzing random well-formed Relax modules against the stock pass (RFC.md, guarantees 1 to 4).

A module is one or two functions over a run-time input ``x`` of a random 2-D shape (zero-size and
size-1 dims included), built from random steps over a pool of same-shaped values (constants,
``x``, earlier results)::

    unary / binary elementwise, matmul by a constant, reshape and permute_dims round trips,
    concat + split (tuples), zeros / ones / full, quantize -> dequantize per tensor and per axis,
    a requantize chain (dequantize(int8 constant) -> quantize -> dequantize) added to a value,
    matmul by a float16 constant cast to float32, conv2d (1x1, where the shape is not empty);
    any result may be wrapped in fold_barrier or fold_allow.

Invariants on each example: with the annotations left out, ``default`` is structurally equal to
stock (and, one example in four, to the reference engine's fold); the folded module computes
bit-identical outputs to the unfolded one (both compiled for the CPU); every barrier survives
our pass and a later stock pass, with nothing downstream of it folded; the input is untouched
(JSON bytes); folding is deterministic and idempotent;
``fold(annotate(m, P))`` under default keeps and folds the same calls as ``fold(m, P)``.

Examples per test: ``FOLD_GUARD_FUZZ_EXAMPLES`` (default 200); the long profile is
``FOLD_GUARD_FUZZ_EXAMPLES=10000 FOLD_GUARD_FUZZ_RUN_EVERY=1``. By default one example in four
(by seed) that folded something is also compiled and run: compiling is most of an example's
cost.
"""

from __future__ import annotations

import collections
import os
from typing import Dict, List, Tuple

import numpy as np
import pytest
import tvm
import tvm_ffi
from golden import CONSTANT_TYPE as CONSTANT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax

import fold_guard.relax as fgr

EXAMPLES = int(os.environ.get("FOLD_GUARD_FUZZ_EXAMPLES", "200"))
#: The default run draws the same examples every time, so CI cannot fail on a module no one has
#: seen; ``FOLD_GUARD_FUZZ_RANDOM=1`` (implied by a long profile) explores new ones each run.
EXPLORE = (
    os.environ.get("FOLD_GUARD_FUZZ_RANDOM", "") not in ("", "0")
    or "FOLD_GUARD_FUZZ_EXAMPLES" in os.environ
)
#: Compile and run (guarantee 2) every Nth example whose fold changed something: a compile is
#: most of an example's time. The long profile sets 1.
RUN_EVERY = int(os.environ.get("FOLD_GUARD_FUZZ_RUN_EVERY", "4"))
POLICIES = (
    "default",
    "fold-qnn",
    "keep-qdq-weights",
    "qdq-accelerator",
    "size-guard",
    "weights-only",
    "keep-low-precision-weights",
    ("keep-requantize", "keep-qdq-weights"),
)
ANNOTATION_OPS = ("relax.fold_barrier", "relax.fold_allow")

UNARY = (
    relax.op.exp,
    relax.op.negative,
    relax.op.abs,
    relax.op.sigmoid,
    relax.op.tanh,
    relax.op.floor,
)
BINARY = (relax.op.add, relax.op.multiply, relax.op.subtract, relax.op.maximum, relax.op.minimum)
KINDS = (
    "unary",
    "binary",
    "matmul",
    "reshape",
    "permute",
    "concat_split",
    "creation",
    "qdq",
    "qdq_axis",
    "conv2d",
    "requantize",
    "half_matmul",
)

_STEP = st.tuples(
    st.sampled_from(KINDS),
    st.integers(0, 1 << 16),  # first operand
    st.integers(0, 1 << 16),  # second operand / op choice
    st.sampled_from(("none", "none", "none", "barrier", "allow")),
)
_FUNCTION = st.lists(_STEP, min_size=1, max_size=8)
_MODULE = st.fixed_dictionaries(
    {
        "shape": st.tuples(st.sampled_from((0, 1, 2, 3)), st.sampled_from((1, 2, 3))),
        "seed": st.integers(0, 2**31 - 1),
        "functions": st.lists(_FUNCTION, min_size=1, max_size=2),
        "policy": st.sampled_from(POLICIES),
    }
)


class _Built:
    """The module, and per function the barrier names and names of values downstream of one."""

    def __init__(self) -> None:
        self.mod: tvm.IRModule = None  # type: ignore[assignment]
        self.guarded: Dict[str, List[str]] = {}


def _build(spec: dict, *, annotate: bool) -> _Built:
    rows, cols = spec["shape"]
    rng = np.random.default_rng(spec["seed"])
    built = _Built()
    bb = relax.BlockBuilder()
    for f_index, steps in enumerate(spec["functions"]):
        name = "main" if f_index == 0 else f"helper{f_index}"
        x = relax.Var("x", relax.TensorType((rows, cols), "float32"))
        guarded: List[str] = []

        def const(shape, scale=2.0):
            return relax.const((rng.standard_normal(shape) * scale).astype("float32"))

        with bb.function(name, [x]):
            with bb.dataflow():
                pool: List[Tuple[relax.Expr, bool]] = [
                    (const((rows, cols)), False),
                    (x, False),
                    (const((rows, cols)), False),
                ]
                outputs = []
                for k, (kind, first, second, wrap) in enumerate(steps):
                    a, a_down = pool[first % len(pool)]
                    b, b_down = pool[second % len(pool)]
                    down = a_down
                    if kind == "unary":
                        value = bb.emit(UNARY[second % len(UNARY)](a), f"v{k}")
                    elif kind == "binary":
                        value, down = (
                            bb.emit(BINARY[second % len(BINARY)](a, b), f"v{k}"),
                            a_down or b_down,
                        )
                    elif kind == "matmul":
                        value = bb.emit(relax.op.matmul(a, const((cols, cols), 0.5)), f"v{k}")
                    elif kind == "reshape" and rows * cols:
                        flat = bb.emit(relax.op.reshape(a, (rows * cols,)), f"r{k}")
                        value = bb.emit(relax.op.reshape(flat, (rows, cols)), f"v{k}")
                    elif kind == "permute" and rows * cols:
                        t = bb.emit(relax.op.permute_dims(a, [1, 0]), f"t{k}")
                        value = bb.emit(relax.op.permute_dims(t, [1, 0]), f"v{k}")
                    elif kind == "concat_split":
                        both = bb.emit(relax.op.concat([a, b], axis=1), f"c{k}")
                        parts = bb.emit(relax.op.split(both, 2, axis=1), f"s{k}")
                        value, down = (
                            bb.emit(relax.TupleGetItem(parts, 0), f"v{k}"),
                            a_down or b_down,
                        )
                    elif kind == "creation":
                        which = second % 3
                        if which == 0:
                            value = bb.emit(relax.op.zeros((rows, cols), "float32"), f"v{k}")
                        elif which == 1:
                            value = bb.emit(relax.op.ones((rows, cols), "float32"), f"v{k}")
                        else:
                            value = bb.emit(
                                relax.op.full(
                                    (rows, cols), relax.const(np.float32(1.5)), "float32"
                                ),
                                f"v{k}",
                            )
                        down = False
                    elif kind in ("qdq", "qdq_axis"):
                        per_axis = kind == "qdq_axis"
                        scale = relax.const(np.full((cols,) if per_axis else (), 0.05, "float32"))
                        zero = relax.const(np.zeros((cols,) if per_axis else (), "int8"))
                        axis = 1 if per_axis else -1
                        q = bb.emit(
                            relax.op.quantize(a, scale, zero, axis=axis, out_dtype="int8"), f"q{k}"
                        )
                        value = bb.emit(
                            relax.op.dequantize(q, scale, zero, axis=axis, out_dtype="float32"),
                            f"v{k}",
                        )
                    elif kind == "requantize":
                        stored = relax.const(rng.integers(-127, 128, (rows, cols)).astype("int8"))
                        zero = relax.const(np.int8(0))
                        s1, s2 = relax.const(np.float32(0.01)), relax.const(np.float32(0.03))
                        w1 = bb.emit(relax.op.dequantize(stored, s1, zero), f"w{k}")
                        w2 = bb.emit(relax.op.quantize(w1, s2, zero, out_dtype="int8"), f"q{k}")
                        w3 = bb.emit(relax.op.dequantize(w2, s2, zero), f"d{k}")
                        value = bb.emit(relax.op.add(a, w3), f"v{k}")
                    elif kind == "half_matmul":
                        half = relax.const(rng.standard_normal((cols, cols)).astype("float16"))
                        weight = bb.emit(relax.op.astype(half, "float32"), f"h{k}")
                        value = bb.emit(relax.op.matmul(a, weight), f"v{k}")
                    elif rows * cols and kind == "conv2d":
                        image = bb.emit(relax.op.reshape(a, (1, 1, rows, cols)), f"i{k}")
                        conv = bb.emit(relax.op.nn.conv2d(image, const((1, 1, 1, 1))), f"k{k}")
                        value = bb.emit(relax.op.reshape(conv, (rows, cols)), f"v{k}")
                    else:
                        value = bb.emit(relax.op.negative(a), f"v{k}")
                    outputs.append(value)
                    if down:
                        guarded.append(value.name)
                    if annotate and wrap == "allow":
                        value = bb.emit(fgr.fold_allow(value), f"a{k}")
                        outputs.append(value)
                        if down:
                            guarded.append(value.name)
                    elif annotate and wrap == "barrier":
                        value = bb.emit(fgr.fold_barrier(value), f"b{k}")
                        outputs.append(value)
                        guarded.append(value.name)
                        down = True
                    pool.append((value, down))
                out = bb.emit_output(relax.Tuple(outputs), "out")
            bb.emit_func_output(out)
        built.guarded[name] = guarded
    built.mod = bb.get()
    return built


def _bound(mod: tvm.IRModule, name: str) -> Dict[str, relax.Expr]:
    return {b.var.name: b.value for block in mod[name].body.blocks for b in block.bindings}


def _op_counts(mod: tvm.IRModule) -> collections.Counter:
    """Op calls by name, annotations left out and creation ops counted as one kind
    (``annotate`` writes a kept ``zeros(s)`` as ``full(s, fold_barrier(0))``)."""
    counts: collections.Counter = collections.Counter()

    def visit(node):
        if (
            isinstance(node, relax.Call)
            and isinstance(node.op, tvm.ir.Op)
            and node.op.name not in ANNOTATION_OPS
        ):
            name = node.op.name
            counts["creation" if name in ("relax.zeros", "relax.ones", "relax.full") else name] += 1

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return counts


def _check_guarded(mod: tvm.IRModule, built: _Built, stage: str) -> None:
    for name, guarded in built.guarded.items():
        bound = _bound(mod, name)
        for var in guarded:
            assert var in bound and not isinstance(bound[var], CONSTANT), (
                f"{stage}: {name}/{var} was folded"
            )


def _run_both(unfolded: tvm.IRModule, folded: tvm.IRModule, spec: dict) -> None:
    """Compile both versions of every function in one module (one compile) and compare bits."""
    functions = {}
    for gvar, func in unfolded.functions.items():
        functions[gvar.name_hint] = func
        functions[f"{gvar.name_hint}_folded"] = folded[gvar.name_hint]
    functions = {name: f.with_attr("global_symbol", name) for name, f in functions.items()}
    vm = relax.VirtualMachine(tvm.compile(tvm.IRModule(functions), target="llvm"), tvm.cpu())
    x = tvm.runtime.tensor(
        np.random.default_rng(spec["seed"] + 1).standard_normal(spec["shape"]).astype("float32")
    )
    for gvar in unfolded.functions:
        want = [t.numpy() for t in vm[gvar.name_hint](x)]
        got = [t.numpy() for t in vm[f"{gvar.name_hint}_folded"](x)]
        _same_bits(got, want)


def _same_bits(got: List[np.ndarray], want: List[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))


STOCK = relax.transform.FoldConstant()


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=not EXPLORE,
)
@given(_MODULE)
def test_fuzzed_relax_modules(spec):
    plain = _build(spec, annotate=False).mod
    built = _build(spec, annotate=True)
    mod = built.mod
    saved, saved_plain = tvm.ir.save_json(mod), tvm.ir.save_json(plain)

    # Guarantee 1: unannotated, default is stock.
    folded_plain = fgr.fold(plain)
    assert tvm_ffi.structural_equal(folded_plain.mod, STOCK(plain))
    # The reference engine is the fast engine's oracle, bit for bit (one example in RUN_EVERY).
    if spec["seed"] % RUN_EVERY == 1:
        reference = fgr.fold(plain, reference_engine=True)
        assert tvm_ffi.structural_equal(reference.mod, folded_plain.mod)
        assert folded_plain.report.fallbacks == ()

    # Guarantees 3 and 4 on the annotated module.
    ours = fgr.fold(mod).mod
    assert _op_counts(ours)["relax.fold_barrier"] == 0  # (annotations are not counted)
    n_barriers = tvm.ir.save_json(mod).count('"relax.fold_barrier"')
    _check_guarded(ours, built, "ours")
    _check_guarded(STOCK(ours), built, "ours+stock")
    assert tvm.ir.save_json(ours).count('"relax.fold_barrier"') == n_barriers
    tvm.ir.assert_structural_equal(fgr.fold(mod).mod, ours)  # deterministic
    tvm.ir.assert_structural_equal(fgr.fold(ours).mod, ours)  # idempotent

    # Guarantee 2: the folded module computes the same bits.
    if spec["seed"] % RUN_EVERY == 0 and not tvm_ffi.structural_equal(ours, mod):
        _run_both(mod, ours, spec)

    # annotate carries the policy: a default fold of the annotated module keeps and folds the
    # same calls as folding under the policy.
    policy = list(spec["policy"]) if isinstance(spec["policy"], tuple) else spec["policy"]
    annotated = fgr.annotate(plain, policy=policy).mod
    assert _op_counts(fgr.fold(annotated).mod) == _op_counts(fgr.fold(plain, policy=policy).mod)

    assert tvm.ir.save_json(mod) == saved and tvm.ir.save_json(plain) == saved_plain
