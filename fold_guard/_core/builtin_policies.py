"""The built-in policies: their rules, the predicates behind them, and ``size_guard``.

Each predicate asks an IR-neutral question (is this a dequantize of an integer constant? a cast
of a float16 weight?) through :mod:`fold_guard._core.op_names`, so one rule serves every IR.
``fold_guard.policies`` is the public face of this module; the registry
(:mod:`fold_guard._core.registry`) starts out holding these policies.
"""

from __future__ import annotations

import numbers
from typing import FrozenSet, Optional

from .errors import PreconditionError
from .graph import FoldNode, InputKind
from .kernel_names import CAST, DEQUANTIZE, QUANTIZE, kernel_role
from .op_names import OP_TABLES
from .policy import CallView, FoldPolicy, Rule
from .reasons import Action

__all__ = [
    "BUILTIN_POLICIES",
    "CAST_OPS",
    "DEFAULT_GROWTH_FACTOR",
    "DEFAULT_MIN_RESULT_BYTES",
    "DEFAULT_POLICY",
    "DEQUANTIZE_OPS",
    "FOLD_QNN_POLICY",
    "KEEP_LOW_PRECISION_WEIGHTS_POLICY",
    "KEEP_QDQ_WEIGHTS_POLICY",
    "KEEP_REQUANTIZE_POLICY",
    "LOW_PRECISION_FLOATS",
    "QDQ_ACCELERATOR_POLICY",
    "QUANTIZE_OPS",
    "REQUANTIZE_OPS",
    "SIZE_GUARD_POLICY",
    "WEIGHTS_ONLY_POLICY",
    "size_guard",
]

#: The quantize, dequantize, requantize and cast ops of every IR (from
#: :mod:`fold_guard._core.op_names`).
QUANTIZE_OPS = frozenset(name for table in OP_TABLES for name in table.quantize)
DEQUANTIZE_OPS = frozenset(name for table in OP_TABLES for name in table.dequantize)
REQUANTIZE_OPS = frozenset(name for table in OP_TABLES for name in table.requantize)
CAST_OPS = frozenset(name for table in OP_TABLES for name in table.cast)
#: Float dtypes a weight may be stored in at half the bytes of float32 (or less).
LOW_PRECISION_FLOATS = frozenset({"float16", "bfloat16"})


def _is_quantized_op(op: str) -> bool:
    return any(table.is_quantized_op(op) for table in OP_TABLES)


#: A fold whose result is more than this many times the bytes of its constant inputs is a
#: broadcast, tile or creation op in disguise: it trades a cheap run-time op for a big constant.
DEFAULT_GROWTH_FACTOR = 4.0
#: Results below this size are never worth keeping for size: the constant costs less than the call.
DEFAULT_MIN_RESULT_BYTES = 4096


def _is_integer(dtype: Optional[str]) -> bool:
    return (dtype or "").startswith(("int", "uint"))


def _is_float(dtype: Optional[str]) -> bool:
    return (dtype or "").startswith(("float", "bfloat"))


def _computes(node: FoldNode, ops: FrozenSet[str], role: str) -> bool:
    """``node`` is one of ``ops``, or a lowered call whose kernel name says it computes ``role``
    (:mod:`fold_guard._core.kernel_names`: ``call_tir(dequantize, ...)`` after LegalizeOps)."""
    if node.lowered:
        return kernel_role(node.callee) == role
    return node.op in ops


def _is_dequantize_of_integer(call: CallView) -> bool:
    """A dequantize (op or kernel: LegalizeOps', MLC-LLM's, CUTLASS's decode) of an integer
    constant: its first operand, the weight (packed ``uint32`` / ``int8`` / ``int4`` included)."""
    return (
        _computes(call.node, DEQUANTIZE_OPS, DEQUANTIZE)
        and bool(call.input_dtypes)
        and _is_integer(call.input_dtypes[0])
    )


def _is_weight_dequantize(call: CallView) -> bool:
    """A dequantize of an integer constant whose value is a conv / matmul / dense weight or bias
    (through other constant calls: a transpose, a reshape): the pattern a QDQ backend matches.
    An embedding table's dequantize read only by ``take`` is not one: kept, a CPU build would
    dequantize the whole table at every call."""
    return _is_dequantize_of_integer(call) and call.feeds_a_weight


def _is_quantize_of_constant(call: CallView) -> bool:
    """A quantize op of a constant, or a quantize / encode kernel of a float constant."""
    if not call.lowered:
        return call.op in QUANTIZE_OPS
    return (
        kernel_role(call.callee) == QUANTIZE
        and bool(call.input_dtypes)
        and _is_float(call.input_dtypes[0])
    )


def _reads_only_as_quantize_data(call: CallView) -> bool:
    """Every call that reads the result is a quantize, reading it as its data (first) operand."""
    consumers = call.graph.value_consumers()[call.node.id]
    return bool(consumers) and all(
        _is_quantize_of(call.graph.nodes[user], call.node.id) for user in consumers
    )


def _is_quantize_of(user: FoldNode, source: int) -> bool:
    if not _computes(user, QUANTIZE_OPS, QUANTIZE) or not user.inputs:
        return False
    data, *params = user.inputs
    reads_data = data.kind is InputKind.NODE and data.node == source
    return reads_data and not any(
        inp.kind is InputKind.NODE and inp.node == source for inp in params
    )


def _starts_requantize_chain(call: CallView) -> bool:
    """``dequantize(integer constant)`` read only by quantizes: the first step of a requantize."""
    return _is_dequantize_of_integer(call) and _reads_only_as_quantize_data(call)


def _is_requantize_of_integer(call: CallView) -> bool:
    """A requantize op (Relay's ``qnn.requantize``) of an integer constant."""
    if call.op not in REQUANTIZE_OPS or not call.input_dtypes:
        return False
    dtype = call.input_dtypes[0] or ""
    return dtype.startswith("int") or dtype.startswith("uint")


def _is_requantize_step(call: CallView) -> bool:
    """Either form of a requantize of a constant: a dequantize -> quantize pair, or one op."""
    return _starts_requantize_chain(call) or _is_requantize_of_integer(call)


def _is_low_precision_weight_cast(call: CallView) -> bool:
    """A cast of a float16 / bfloat16 constant to a wider float whose result feeds only weights."""
    if not _computes(call.node, CAST_OPS, CAST):
        return False
    if len(call.input_dtypes) != 1 or len(call.outputs) != 1:
        return False
    source, target = call.input_dtypes[0], call.outputs[0].dtype
    return (
        source in LOW_PRECISION_FLOATS
        and target in ("float32", "float64")
        and call.feeds_only_weights
    )


def _is_real(value: object) -> bool:
    """An int or float, not a bool (``True`` is an int in Python, but never meant as a size)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def size_guard(
    growth_factor: float = DEFAULT_GROWTH_FACTOR,
    *,
    min_result_bytes: int = DEFAULT_MIN_RESULT_BYTES,
    name: str = "size-guard",
) -> FoldPolicy:
    """A policy that keeps folds whose result is much larger than their constant inputs.

    A call is kept when its result takes at least ``min_result_bytes`` and at least
    ``growth_factor`` times the bytes of its largest input (so ``zeros((1024, 1024))``, a
    broadcast of a scalar, a ``tile`` or ``zeros_like`` of a run-time tensor stay as run-time
    ops). Measured against the largest input, not the sum of them, so that a dequantize of an
    int8 weight to float32 (exactly 4x the weight; its scales and zero points are small) is
    caught by the default factor of 4; an input whose static type alone the call reads is not
    counted.

    >>> guard = size_guard(2.0)
    >>> guard.rules[0].name
    'size-guard'
    """
    if not _is_real(growth_factor) or not growth_factor > 0:
        raise PreconditionError(
            f"size_guard growth_factor must be a number > 0, got {growth_factor!r}"
        )
    if not _is_real(min_result_bytes) or min_result_bytes < 0:
        raise PreconditionError(
            f"size_guard min_result_bytes must be a number >= 0, got {min_result_bytes!r}"
        )

    def grows_too_much(call: CallView) -> bool:
        result = call.result_nbytes
        if not result or result < min_result_bytes:  # an empty result costs nothing
            return False
        return result >= growth_factor * call.largest_input_nbytes

    rule = Rule(
        name,
        Action.KEEP,
        f"keep a fold whose result is >= {min_result_bytes} bytes and at least "
        f"{growth_factor:g}x the bytes of its largest input (a dequantize of int8 to float32)",
        grows_too_much,
        reads_ops=False,
    )
    return FoldPolicy(name, "keep folds that would materialise large constants", (rule,))


DEFAULT_POLICY = FoldPolicy(
    "default", "exactly what the IR's stock FoldConstant folds (no rules of its own)", ()
)


def _is_quantized_compute_op(call: CallView) -> bool:
    return _is_quantized_op(call.op) and call.op not in QUANTIZE_OPS | DEQUANTIZE_OPS


_KEEP_DEQUANTIZE_OF_INTEGER = Rule(
    "keep-dequantize-of-integer-constant",
    Action.KEEP,
    "dequantize of an integer constant (or a dequantize / decode kernel of one) that feeds a "
    "conv / matmul / dense weight or bias stays, so backends can match weight Q/DQ and "
    "decode-matmul patterns (elsewhere, an embedding's take, it folds as the default says)",
    _is_weight_dequantize,
)
_FOLD_QUANTIZE_OF_CONSTANT = Rule(
    "fold-quantize-of-constant",
    Action.FOLD,
    "quantize of a constant (or a quantize / encode kernel of a float constant) becomes an "
    "integer constant",
    _is_quantize_of_constant,
)
# A weight that arrives as dequantize(int W) -> quantize(s2) -> dequantize -> op: without these,
# the first dequantize is kept (its operand is an integer constant) and nothing after it is
# constant, so the whole chain runs at run time. Folded, the chain is one integer constant at the
# last scale with only the final dequantize kept: the plain QDQ weight the backend matches.
_FOLD_REQUANTIZE_CHAIN = Rule(
    "fold-requantize-chain",
    Action.FOLD,
    "dequantize of an integer constant read only by quantizes folds with them into one integer "
    "constant at the last scale (only where they fold too)",
    _starts_requantize_chain,
    needs_folded_consumers=True,
)
_FOLD_REQUANTIZE_OF_CONSTANT = Rule(
    "fold-requantize-of-constant",
    Action.FOLD,
    "requantize of an integer constant (a dequantize -> quantize pair in one op) becomes an "
    "integer constant at its output scale",
    _is_requantize_of_integer,
)
_KEEP_LOW_PRECISION_WEIGHT_CAST = Rule(
    "keep-low-precision-weight-cast",
    Action.KEEP,
    "a cast of a float16 / bfloat16 constant to a wider float that feeds only weights stays, so "
    "the backend receives the low-precision weight instead of a float32 copy",
    _is_low_precision_weight_cast,
)

KEEP_QDQ_WEIGHTS_POLICY = FoldPolicy(
    "keep-qdq-weights",
    "fold quantize(constant) into integer constants, keep dequantize(integer constant) for "
    "QDQ pattern matching; a requantize chain folds to one integer constant at its last scale, "
    "and a float16 / bfloat16 weight keeps its cast",
    (
        _FOLD_REQUANTIZE_CHAIN,
        _KEEP_DEQUANTIZE_OF_INTEGER,
        _FOLD_QUANTIZE_OF_CONSTANT,
        _FOLD_REQUANTIZE_OF_CONSTANT,
        _KEEP_LOW_PRECISION_WEIGHT_CAST,
    ),
)

QDQ_ACCELERATOR_POLICY = FoldPolicy(
    "qdq-accelerator",
    "for backends that offload quantized patterns: weights become integer constants, while the "
    "weight and bias dequantize and every other quantized op on constants stay for the pattern "
    "table (composed before fold-qnn, these rules still win); a requantize chain folds to one "
    "integer constant at its last scale, and a float16 / bfloat16 weight keeps its cast",
    (
        _FOLD_REQUANTIZE_CHAIN,
        _KEEP_DEQUANTIZE_OF_INTEGER,
        _FOLD_REQUANTIZE_OF_CONSTANT,
        Rule(
            "keep-quantized-ops",
            Action.KEEP,
            "a QNN op other than quantize / dequantize / requantize (qnn.conv2d, qnn.add, ...) "
            "stays unlowered even on constants",
            _is_quantized_compute_op,
        ),
        _FOLD_QUANTIZE_OF_CONSTANT,
        _KEEP_LOW_PRECISION_WEIGHT_CAST,
    ),
)

KEEP_REQUANTIZE_POLICY = FoldPolicy(
    "keep-requantize",
    "keep the requantize boundary of a weight (compose it before a QDQ policy: "
    "['keep-requantize', 'keep-qdq-weights'])",
    (
        Rule(
            "keep-requantize-boundary",
            Action.KEEP,
            "a requantize of an integer constant stays (a dequantize read only by quantizes, or "
            "one requantize op), so the backend sees both scales",
            _is_requantize_step,
        ),
    ),
)

KEEP_LOW_PRECISION_WEIGHTS_POLICY = FoldPolicy(
    "keep-low-precision-weights",
    "keep the cast of a float16 / bfloat16 weight; the rest as the IR's default (compose it with "
    "weights-only or a backend's policy)",
    (_KEEP_LOW_PRECISION_WEIGHT_CAST,),
)

WEIGHTS_ONLY_POLICY = FoldPolicy(
    "weights-only",
    "fold only what ends as a weight or bias input of conv / matmul / dense; every other "
    "constant call stays (those that feed weights fold as the IR's default says)",
    (
        Rule(
            "keep-non-weight-constants",
            Action.KEEP,
            "the result does not end only as weight or bias inputs of conv / matmul / dense",
            lambda call: not call.feeds_only_weights,
        ),
    ),
)

SIZE_GUARD_POLICY = size_guard()

FOLD_QNN_POLICY = FoldPolicy(
    "fold-qnn",
    "every constant QNN call folds too: Relay's FoldConstant(fold_qnn=True); on Relax, same as default",
    (
        Rule(
            "fold-qnn-ops",
            Action.FOLD,
            "a QNN op with constant inputs is lowered and evaluated, as FoldConstant(fold_qnn=True) does",
            lambda call: _is_quantized_op(call.op),
        ),
    ),
)

#: Every built-in policy, the registry's initial contents.
BUILTIN_POLICIES = (
    DEFAULT_POLICY,
    FOLD_QNN_POLICY,
    KEEP_LOW_PRECISION_WEIGHTS_POLICY,
    KEEP_QDQ_WEIGHTS_POLICY,
    KEEP_REQUANTIZE_POLICY,
    QDQ_ACCELERATOR_POLICY,
    SIZE_GUARD_POLICY,
    WEIGHTS_ONLY_POLICY,
)
