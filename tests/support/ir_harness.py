"""The checks both adapters' bad-input catalogues, fuzzers and model zoos share, each stated once.

Each check runs over a small per-IR object, :class:`IR`: ``tests/relax/harness_relax.py``
(``RELAX``) and ``tests/relay/harness_relay.py`` (``RELAY``) implement it. This module imports
neither ``tvm.relax`` nor ``tvm.relay`` (only ``tvm.ir``, which both TVM builds have), so it
serves the Relax suite (apache-tvm 0.27) and the Relay suite (hhb-tvm) alike::

    catalogue   Kind, check_kind, common_kinds(ir), policy_kinds(ir)
                one kind of bad input: a fold_guard error whose message names the expression,
                or a result judged by a check; either way the caller's module is unchanged
    fuzzers     fuzz_settings(default), fuzz_step(kinds), FUZZ_POLICIES, check_fuzzed(ir, ...)
                guarantees 1 to 4 on one random module and its annotated twin
    model zoo   zoo_model(ir, name, float_weights), check_import_dequantizes_every_weight,
                check_float_weights_quantize_every_weight, check_runs_like_onnxruntime
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections import Counter
from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    Dict,
    FrozenSet,
    Iterator,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
)

import numpy as np
import pytest
import tvm
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import fold_guard
from fold_guard import Action, CallView, FoldPolicy, Rule, policy_registry_scope, register_policy

from .profiles import examples

__all__ = [
    "FUZZ_EXPLORE",
    "FUZZ_POLICIES",
    "FUZZ_RUN_EVERY",
    "FUZZ_SHAPE",
    "IR",
    "ZOO_MODELS",
    "Kind",
    "Signature",
    "ZooModel",
    "assert_like_stock",
    "assert_same_bits",
    "check_float_weights_quantize_every_weight",
    "check_fuzzed",
    "check_import_dequantizes_every_weight",
    "check_kind",
    "check_runs_like_onnxruntime",
    "common_kinds",
    "dtype_module",
    "exp_module",
    "fuzz_settings",
    "fuzz_step",
    "like_stock",
    "op_counts",
    "policy_kinds",
    "untouched",
    "weights_among",
    "zoo_builders",
    "zoo_model",
]

Signature = Tuple[str, Tuple[int, ...]]  # (dtype, shape) of a constant


class IR(Protocol):
    """What the shared checks need of one IR (an instance per suite: ``RELAX``, ``RELAY``)."""

    api: Any  #: the adapter: fold_guard.relax or fold_guard.relay
    title: str  #: "Relax" or "Relay", as fold_guard's messages name the IR
    barrier_op: str  #: the annotations' op names, as calls show them
    allow_op: str
    creation_ops: FrozenSet[str]  #: zeros / ones / full (``annotate`` may write one as another)
    quantize_op: str
    dequantize_op: str
    #: policies whose fold equals a stock pass on an unannotated module (guarantee 1)
    stock_policies: Tuple[str, ...]
    #: the catalogue's constant ``A`` (float32) and the dtypes its ``dtype-*`` kinds fold
    catalogue_constant: np.ndarray
    catalogue_dtypes: Tuple[str, ...]
    #: a regex of the hint the error for a bare function gives
    function_hint: str
    #: how messages name the ``exp`` call of :func:`exp_module`
    exp_label: str

    def module(self, body: Callable[[Any], Any]) -> tvm.IRModule:
        """``main(x) = body(x)`` for ``x`` a float32 tensor of ``catalogue_constant``'s shape."""

    def const(self, value: np.ndarray) -> Any: ...
    def op(self, name: str) -> Callable[..., Any]:
        """The IR's op function for ``add``, ``multiply``, ``exp``, ``logical_or``, ``cast``."""

    def op_name(self, name: str) -> str:
        """``add`` as calls of the IR name it (``relax.add``, ``add``)."""

    def assert_equal(self, got: tvm.IRModule, want: tvm.IRModule) -> None: ...
    def equal(self, a: tvm.IRModule, b: tvm.IRModule) -> bool: ...
    def stock_fold(self, mod: tvm.IRModule, policy: str = "default") -> tvm.IRModule: ...
    def reference_fold(self, mod: tvm.IRModule) -> Optional[Any]:
        """The reference engine's fold result, or None where the IR has no such engine."""

    def op_names(self, mod: tvm.IRModule) -> List[str]:
        """The op of every call in every function, annotations included."""

    def downstream_of_barriers(self, mod: tvm.IRModule) -> Counter:
        """Op calls (by name) that read a barrier, directly or through other values, and the barriers."""

    def is_known_tvm_failure(self, err: Exception, spec: dict) -> bool:
        """A failure of TVM's own (stock pass, build) on this example that is not fold_guard's."""

    def run_both(
        self, unfolded: tvm.IRModule, folded: tvm.IRModule, spec: dict
    ) -> Optional[Tuple[List[np.ndarray], List[np.ndarray]]]:
        """(folded outputs, unfolded outputs) on the CPU for the input ``spec`` seeds, or None
        where TVM cannot build the unfolded module (``is_known_tvm_failure``)."""

    def import_onnx(self, model: Any) -> tvm.IRModule: ...
    def constant_operands(self, mod: tvm.IRModule, op_name: str) -> List[Signature]:
        """(dtype, shape) of the constant first operand of every call of ``op_name``."""


@contextlib.contextmanager
def untouched(*mods: object) -> Iterator[None]:
    """The body leaves every module of ``mods`` byte for byte as it was (``tvm.ir.save_json``)."""
    saved = [(mod, tvm.ir.save_json(mod)) for mod in mods if isinstance(mod, tvm.IRModule)]
    yield
    for mod, json in saved:
        assert tvm.ir.save_json(mod) == json, "the caller's module was changed"


def assert_same_bits(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))


# ------------------------------------------------------------------------------ the catalogue


@dataclass(frozen=True)
class Kind:
    """One kind of input: how to make it, what to call on it, and what must come out.

    ``error`` None means the input is valid: the call must succeed, and ``check(result, input)``
    judges the result.
    """

    make: Callable[[], object]
    call: Callable[[object], object]
    error: Optional[type] = None
    match: str = ""
    check: Optional[Callable[[Any, Any], None]] = None


def check_kind(kind: Kind) -> None:
    """Run one catalogue entry: the error class and message, or the check; the input unchanged."""
    subject = kind.make()
    with untouched(subject):
        if kind.error is not None:
            with pytest.raises(kind.error, match=kind.match):
                kind.call(subject)
        else:
            assert kind.check is not None, "a valid kind needs a check"
            kind.check(kind.call(subject), subject)


def exp_module(ir: IR) -> tvm.IRModule:
    """``main(x) = add(x, exp(A))``: one constant call, an ``exp``."""
    return ir.module(lambda x: ir.op("add")(x, ir.op("exp")(ir.const(ir.catalogue_constant))))


_NUMPY_DTYPES = frozenset(("bool", "int8", "uint8", "int32", "int64", "float16", "float64"))


def dtype_module(ir: IR, dtype: str) -> tvm.IRModule:
    """``main(x) = add(x, cast(c + c, float32))`` for a constant ``c`` of ``dtype`` (``c or c``
    for bool); a dtype NumPy lacks is made by a cast of a float32 constant (which folds too)."""
    values = ir.catalogue_constant
    if dtype in _NUMPY_DTYPES:
        c = ir.const(values.astype(dtype))
    else:  # bfloat16, int4, float8_...: no NumPy dtype
        c = ir.op("cast")(ir.const(values), dtype)
    combine = ir.op("logical_or" if dtype == "bool" else "add")
    return ir.module(lambda x: ir.op("add")(x, ir.op("cast")(combine(c, c), "float32")))


def _nonfinite_module(ir: IR) -> tvm.IRModule:
    shape = ir.catalogue_constant.shape
    values = np.array([np.nan, np.inf, -np.inf, 1, 2, 3][: int(np.prod(shape))], "float32")
    c = ir.const(values.reshape(shape))
    two = ir.const(np.float32(2))
    return ir.module(lambda x: ir.op("add")(x, ir.op("multiply")(ir.op("exp")(c), two)))


def like_stock(ir: IR) -> Callable[[Any, tvm.IRModule], None]:
    """A kind's check: the fold equals the stock pass's on the same input."""
    return lambda result, mod: ir.assert_equal(result.mod, ir.stock_fold(mod))


def common_kinds(ir: IR) -> Dict[str, Kind]:
    """The catalogue entries both IRs have in the same shape (``policy_kinds`` adds the policies)."""
    fold, strict = ir.api.fold, functools.partial(ir.api.fold, strict=True)
    unsupported = fold_guard.UnsupportedIRError
    a = ir.catalogue_constant

    def nested() -> tvm.IRModule:
        barrier, allow = ir.api.fold_barrier, ir.api.fold_allow
        inner = lambda: barrier(barrier(allow(ir.op("exp")(ir.const(a)))))  # noqa: E731
        return ir.module(lambda x: ir.op("add")(x, inner()))

    def two_barriers_one_add(result: Any, mod: tvm.IRModule) -> None:
        ops = Counter(ir.op_names(result.mod))
        assert ops[ir.barrier_op] == 2 and ops[ir.op_name("add")] == 1, ops

    kinds = {
        "not-a-module-none": Kind(
            lambda: None, fold, unsupported, r"expects a tvm.IRModule, got NoneType"
        ),
        "not-a-module-str": Kind(lambda: "def @main() {}", fold, unsupported, r"got str"),
        "not-a-module-function": Kind(
            lambda: exp_module(ir)["main"],
            ir.api.plan,
            unsupported,
            rf"got Function.*{ir.function_hint}",
        ),
        "unknown-policy": Kind(
            lambda: exp_module(ir),
            lambda m: fold(m, policy="npu-turbo"),
            fold_guard.UnknownPolicyError,
            r"unknown fold policy 'npu-turbo'; registered",
        ),
        "nested-annotations": Kind(nested, strict, check=two_barriers_one_add),
        "nan-and-inf": Kind(lambda: _nonfinite_module(ir), fold, check=like_stock(ir)),
    }
    for name, annotation in (
        ("annotate-a-non-expression", "fold_barrier"),
        ("allow-a-non-expression", "fold_allow"),
    ):
        kinds[name] = Kind(
            lambda: a,
            getattr(ir.api, annotation),
            unsupported,
            rf"{annotation} expects a {ir.title} expression, got ndarray",
        )
    for dtype in ir.catalogue_dtypes:
        kinds[f"dtype-{dtype}"] = Kind(
            lambda d=dtype: dtype_module(ir, d), fold, check=like_stock(ir)
        )
    kinds.update(policy_kinds(ir))
    return kinds


def keep_exp_policy(predicate: Callable[[Any], Any]) -> FoldPolicy:
    """A backend's policy ``my-npu`` with one rule ``keep-exp`` whose predicate is ``predicate``."""
    return FoldPolicy(
        "my-npu", "a backend's policy", (Rule("keep-exp", Action.KEEP, "exp stays", predicate),)
    )


def register_twice(_mod: object = None) -> None:
    """Register ``my-npu`` twice (the second is an error), restoring the registry afterwards."""
    with policy_registry_scope():
        register_policy(keep_exp_policy(lambda call: True))
        register_policy(keep_exp_policy(lambda call: True))


class _WrongDecide(FoldPolicy):
    """A policy whose ``decide`` answers (FOLD, None) instead of (Action, Rule) or None."""

    def __init__(self) -> None:
        super().__init__("wrong-decide", "decide names no rule", ())

    def decide(self, call: CallView) -> Optional[Tuple[Action, Rule]]:
        return (Action.FOLD, None)  # type: ignore[return-value]


def policy_kinds(ir: IR) -> Dict[str, Kind]:
    """The catalogue entries about policies, on :func:`exp_module`."""
    adapter, make = ir.api, functools.partial(exp_module, ir)
    on_exp = f"on main: {re.escape(ir.exp_label)}"
    rule_error, precondition = fold_guard.PolicyRuleError, fold_guard.PreconditionError
    return {
        "empty-policy-list": Kind(
            make,
            lambda m: adapter.fold(m, policy=[]),
            precondition,
            r"non-empty list of them, got \[\]",
        ),
        "duplicate-registration": Kind(
            make, register_twice, precondition, r"a policy named 'my-npu' is already registered"
        ),
        "raising-rule": Kind(
            make,
            lambda m: adapter.fold(m, policy=keep_exp_policy(lambda call: 1 / 0)),
            rule_error,
            rf"policy 'my-npu', rule 'keep-exp', {on_exp}: the predicate raised ZeroDivisionError",
        ),
        "non-bool-rule": Kind(
            make,
            lambda m: adapter.FoldConstant(keep_exp_policy(lambda call: "no"))(m),
            rule_error,
            rf"rule 'keep-exp', {on_exp}: the predicate returned str 'no'",
        ),
        "ndarray-rule": Kind(
            make,
            lambda m: adapter.plan(m, keep_exp_policy(lambda call: np.ones(2, bool))),
            rule_error,
            rf"{on_exp}: the predicate returned ndarray",
        ),
        "decide-returns-no-rule": Kind(
            make,
            lambda m: adapter.fold(m, policy=_WrongDecide()),
            rule_error,
            r"policy 'wrong-decide' \(_WrongDecide.decide\) returned \(<Action.FOLD: 'fold'>, None\)",
        ),
        "rule-with-str-action": Kind(
            make,
            lambda m: adapter.fold(m, policy=FoldPolicy("p", "d", (Rule("r", "keep", "d", bool),))),
            precondition,
            r"rule 'r': action must be Action.FOLD or Action.KEEP, got str 'keep'",
        ),
        "size-guard-str": Kind(
            make,
            lambda m: adapter.fold(m, policy=fold_guard.size_guard("2")),
            precondition,
            r"size_guard growth_factor must be a number > 0, got '2'",
        ),
        "negative-budget": Kind(
            make,
            lambda m: adapter.fold(m, max_fold_bytes=-1),
            precondition,
            r"max_fold_bytes must be a byte count .* got int -1",
        ),
    }


# ------------------------------------------------------------------------------ the fuzzers

#: ``FOLD_GUARD_FUZZ_RANDOM=1`` (implied by ``FOLD_GUARD_FUZZ_EXAMPLES``, a long profile) draws new
#: examples each run; otherwise every run draws the same ones, so CI cannot fail on a module no
#: one has seen.
FUZZ_EXPLORE = (
    os.environ.get("FOLD_GUARD_FUZZ_RANDOM", "") not in ("", "0")
    or "FOLD_GUARD_FUZZ_EXAMPLES" in os.environ
)
#: Compile and run (guarantee 2) every Nth example whose fold changed something, and compare
#: with the reference engine (where the IR has one) every Nth: a compile is most of an example's
#: time. The long profile sets 1.
FUZZ_RUN_EVERY = int(os.environ.get("FOLD_GUARD_FUZZ_RUN_EVERY", "4"))
#: The policies an example is annotated with; each IR adds one list of two.
FUZZ_POLICIES: Tuple[object, ...] = (
    "default",
    "fold-qnn",
    "keep-qdq-weights",
    "qdq-accelerator",
    "size-guard",
    "weights-only",
    "keep-low-precision-weights",
)


def fuzz_settings(default_examples: int) -> Callable[[Any], Any]:
    """Hypothesis settings of a fuzzer: ``FOLD_GUARD_FUZZ_EXAMPLES`` examples (else the IR's
    default, scaled to the hypothesis profile: see ``support.profiles``), no deadline,
    derandomized unless exploring."""
    fixed = os.environ.get("FOLD_GUARD_FUZZ_EXAMPLES")
    return settings(
        max_examples=int(fixed) if fixed else examples(default_examples),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=not FUZZ_EXPLORE,
    )


def fuzz_step(kinds: Sequence[str]) -> Any:
    """One step of a random module: (kind, first operand, second operand or op choice, wrapper)."""
    return st.tuples(
        st.sampled_from(kinds),
        st.integers(0, 1 << 16),
        st.integers(0, 1 << 16),
        st.sampled_from(("none", "none", "none", "barrier", "allow")),
    )


#: The run-time input's 2-D shape: zero-size and size-1 dims included.
FUZZ_SHAPE = st.tuples(st.sampled_from((0, 1, 2, 3)), st.sampled_from((1, 2, 3)))


def op_counts(ir: IR, mod: tvm.IRModule) -> Counter:
    """Op calls by name, annotations left out and creation ops counted as one kind
    (``annotate`` writes a kept ``zeros(s)`` as ``full(s, fold_barrier(0))``)."""
    return Counter(
        "creation" if name in ir.creation_ops else name
        for name in ir.op_names(mod)
        if name not in (ir.barrier_op, ir.allow_op)
    )


def assert_like_stock(ir: IR, result: Any, mod: tvm.IRModule, policy: str, spec: dict) -> None:
    """``result`` (the fold of ``mod`` under ``policy``) equals the stock pass's fold. Where the
    stock pass itself crashes (a known TVM failure), ours kept what it could not evaluate."""
    try:
        stock = ir.stock_fold(mod, policy)
    except Exception as err:  # noqa: BLE001 - checked: only a known TVM failure is accepted
        assert ir.is_known_tvm_failure(err, spec), err
        reasons = [d.reason for d in result.plan.decisions]
        assert fold_guard.Reason.EVAL_FAILED in reasons, result.plan.explain()
        return
    ir.assert_equal(result.mod, stock)


def check_fuzzed(ir: IR, plain: tvm.IRModule, mod: tvm.IRModule, spec: dict) -> None:
    """Guarantees 1 to 4 on one example: ``plain`` unannotated, ``mod`` the same with annotations.

    ``spec`` has the example's ``seed`` and ``shape`` (the run-time input) and ``policy``.
    """
    fold = ir.api.fold
    with untouched(plain, mod):  # Guarantee 4: the inputs are untouched.
        # Guarantee 1: unannotated, each stock-equivalent policy is the stock pass.
        folded = {policy: fold(plain, policy=policy) for policy in ir.stock_policies}
        for policy, result in folded.items():
            assert_like_stock(ir, result, plain, policy, spec)
            assert result.report.fallbacks == ()  # no fast mechanism failed
        # The reference engine (where the IR has one) is the fast engine's oracle, bit for bit:
        # on other examples than those run below (on every one in the long profile).
        if spec["seed"] % FUZZ_RUN_EVERY == 1 % FUZZ_RUN_EVERY:
            reference = ir.reference_fold(plain)
            if reference is not None:
                ir.assert_equal(reference.mod, folded["default"].mod)

        # Guarantee 3: barriers and everything downstream of them survive ours and a later
        # stock pass.
        guarded = ir.downstream_of_barriers(mod)
        ours = fold(mod).mod
        assert ir.downstream_of_barriers(ours) == guarded
        try:
            after_stock = ir.stock_fold(ours)
        except Exception as err:  # noqa: BLE001 - checked: only a known TVM failure is accepted
            assert ir.is_known_tvm_failure(err, spec), err
        else:
            assert ir.downstream_of_barriers(after_stock) == guarded
        # Guarantee 4: deterministic and idempotent.
        ir.assert_equal(fold(mod).mod, ours)
        ir.assert_equal(fold(ours).mod, ours)

        # Guarantee 2: the folded module computes the same bits.
        if spec["seed"] % FUZZ_RUN_EVERY == 0 and not ir.equal(ours, mod):
            outputs = ir.run_both(mod, ours, spec)
            if outputs is not None:
                assert_same_bits(*outputs)

        # annotate carries the policy: a default fold of the annotated module keeps and folds
        # the same calls as folding under the policy.
        policy = list(spec["policy"]) if isinstance(spec["policy"], tuple) else spec["policy"]
        annotated = ir.api.annotate(plain, policy=policy).mod
        assert op_counts(ir, fold(annotated).mod) == op_counts(ir, fold(plain, policy=policy).mod)


# ------------------------------------------------------------------------------ the model zoo

#: The QDQ ONNX models of :mod:`_common.onnx_models` both zoos import.
ZOO_MODELS: Tuple[str, ...] = ("residual_cnn", "transformer_block")


def zoo_builders(name: str) -> Tuple[Callable[..., Any], Callable[..., Any]]:
    """(QDQ builder, float builder) of a zoo model."""
    from _common import onnx_models

    return getattr(onnx_models, f"make_{name}"), getattr(onnx_models, f"float_{name}")


class ZooModel:
    """One model (seed 0) and its import into ``ir``."""

    def __init__(self, ir: IR, name: str, float_weights: bool) -> None:
        from _common import onnx_models

        make, make_float = zoo_builders(name)
        self.float_model = make_float(0)
        self.onnx = make(0, float_weights=float_weights)
        self.weights = sorted(onnx_models.weight_shapes(self.float_model))
        self.nodes = Counter(node.op_type for node in self.onnx.graph.node)
        self.imported = ir.import_onnx(self.onnx)


@functools.cache
def zoo_model(ir: IR, name: str, float_weights: bool = False) -> ZooModel:
    """Each model is built and imported once (``zoo_model.cache_clear()`` drops them)."""
    return ZooModel(ir, name, float_weights)


def weights_among(signatures: Sequence[Signature], dtype: str) -> List[Tuple[int, ...]]:
    """Sorted shapes of the weights among constants: in these models the only ones of rank >= 2."""
    return sorted(shape for dt, shape in signatures if dt == dtype and len(shape) >= 2)


def _initializers(model: ZooModel, onnx_op: str) -> Counter:
    from _common import onnx_models

    return Counter(onnx_models.initializer_inputs(model.onnx, onnx_op))


def check_import_dequantizes_every_weight(ir: IR, model: ZooModel) -> None:
    """The import keeps every weight as ``dequantize(<int8 constant>)``: one per DequantizeLinear
    of an initializer (weights, biases and the rest), and no quantize of a constant."""
    dequantized = ir.constant_operands(model.imported, ir.dequantize_op)
    assert model.weights and weights_among(dequantized, "int8") == model.weights
    assert Counter(dequantized) == _initializers(model, "DequantizeLinear")
    assert len(dequantized) > len(model.weights)  # the biases are constants too
    assert ir.constant_operands(model.imported, ir.quantize_op) == []


def check_float_weights_quantize_every_weight(ir: IR, model: ZooModel) -> None:
    """With ``float_weights=True`` every weight is ``quantize(<fp32 constant>)``; no weight is
    dequantized from an int8 constant any more, only the int32 biases are."""
    quantized = ir.constant_operands(model.imported, ir.quantize_op)
    assert weights_among(quantized, "float32") == model.weights
    assert all(dtype == "float32" for dtype, _ in quantized)
    assert Counter(quantized) == _initializers(model, "QuantizeLinear")
    dequantized = ir.constant_operands(model.imported, ir.dequantize_op)
    assert weights_among(dequantized, "int8") == []
    assert Counter(dequantized) == _initializers(model, "DequantizeLinear")
    assert {dtype for dtype, _ in dequantized} == {"int32"}


def check_runs_like_onnxruntime(
    model: ZooModel,
    runs: Mapping[str, Tuple[Callable[[Dict[str, np.ndarray]], Sequence[np.ndarray]], float]],
) -> None:
    """Each of ``runs`` (name -> (feed -> outputs, absolute tolerance)) gives one output, which
    matches onnxruntime's on three inputs."""
    from _common import onnx_models

    for seed in (1, 2, 3):
        feed = onnx_models.input_feed(model.onnx, seed)
        (expected,) = onnx_models.run_onnxruntime(model.onnx, feed)
        for name, (run, atol) in runs.items():
            (actual,) = run(feed)
            assert actual.shape == expected.shape, name
            np.testing.assert_allclose(actual, expected, rtol=0, atol=atol, err_msg=name)
