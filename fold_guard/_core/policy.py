"""Fold policies: ordered rules that say fold, keep, or nothing about a constant call.

A policy only ever sees calls whose inputs are all constant (the planner asks nothing else), so a
rule such as "keep dequantize of an integer tensor" means "keep dequantize of an integer
*constant*". The first rule that matches decides; when none matches the IR's default applies
(what the stock ``FoldConstant`` of that IR would do). Policies compose by concatenating rules.

The registry of named policies is the one piece of module-global state that changes an answer
(``_serial`` lists the rest, caches that never do): backends register their policy once, and any
API that takes a policy then accepts its name.
"""

from __future__ import annotations

import contextlib
import difflib
import numbers
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple, Union

from .errors import PolicyRuleError, PreconditionError, UnknownPolicyError
from .graph import FoldGraph, FoldNode, InputKind, TensorInfo
from .op_names import OP_TABLES
from .reasons import Action
from .uses import GraphUses

__all__ = [
    "BUDGET_RULE",
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
    "CallView",
    "FoldPolicy",
    "PolicySpec",
    "Rule",
    "compose",
    "get_policy",
    "list_policies",
    "memory_budget",
    "policy_registry_scope",
    "register_policy",
    "resolve_policy",
    "size_guard",
    "unregister_policy",
    "with_budget",
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


class CallView:
    """What a policy rule sees of one constant call: op, attributes, inputs, outputs, uses.

    "Constant" includes weights passed as parameters (Relax ``num_input``): a rule decides the
    same whether a weight is a constant (its verdict is a fold or a keep) or a parameter (a
    lift ahead of run time or a keep); :attr:`reads_parameters` tells the two apart.

    ``uses`` is shared by every view of one plan, so graph-wide facts (consumers, which values
    feed only weights) are computed once per graph, not once per call.

    >>> from fold_guard._core.graph import FoldNode, FoldGraph, NodeInput, InputKind, TensorInfo
    >>> node = FoldNode(0, "relax.zeros", "z", "main", (), (TensorInfo.of("float32", (64, 64)),))
    >>> view = CallView(node, FoldGraph((node,)))
    >>> view.result_nbytes, view.constant_input_nbytes
    (16384, 0)
    """

    __slots__ = ("graph", "node", "uses")

    def __init__(self, node: FoldNode, graph: FoldGraph, uses: Optional[GraphUses] = None):
        self.node = node
        self.graph = graph
        self.uses = uses if uses is not None else GraphUses(graph)

    @property
    def op(self) -> str:
        return self.node.op

    @property
    def attrs(self) -> Mapping[str, object]:
        return self.node.attrs

    @property
    def input_tensors(self) -> Tuple[Optional[TensorInfo], ...]:
        return tuple(inp.tensor for inp in self.node.inputs)

    @property
    def input_dtypes(self) -> Tuple[Optional[str], ...]:
        return tuple(None if t is None else t.dtype for t in self.input_tensors)

    @property
    def outputs(self) -> Tuple[TensorInfo, ...]:
        return self.node.outputs

    @property
    def result_nbytes(self) -> Optional[int]:
        sizes = [out.nbytes for out in self.node.outputs if out.nbytes is not None]
        return None if len(sizes) != len(self.node.outputs) else sum(sizes)

    @property
    def constant_input_nbytes(self) -> int:
        return sum(t.nbytes or 0 for t in self.input_tensors if t is not None)

    @property
    def consumer_ops(self) -> Tuple[str, ...]:
        return tuple(self.graph.nodes[user].op for user in self.uses.consumers[self.node.id])

    @property
    def feeds_only_weights(self) -> bool:
        """True when the result ends only as weight or bias inputs of conv / matmul / dense.

        See :mod:`fold_guard._core.uses` for the exact rule (annotations and other constant calls
        are looked through).
        """
        return self.uses.feeds_only_weights(self.node.id)

    def input_is_constant_literal(self, index: int) -> bool:
        inputs = self.node.inputs
        return index < len(inputs) and inputs[index].kind is InputKind.CONSTANT

    @property
    def reads_parameters(self) -> bool:
        """True when the call computes from a weight passed as a parameter (directly or not).

        Such a call cannot fold in this pass; the rule's "fold" means "lift ahead of run time".
        """
        return self.node.id in self.uses.reads_parameters


@dataclass(frozen=True)
class Rule:
    """One named rule: when ``matches(call)`` holds, the call gets ``action``.

    ``reads_ops`` says whether the rule decides from op names (the call's, its consumers'). Such a
    rule cannot see what an already-lowered kernel call computes, so the planner refuses to ask it
    about one rather than let it fall through to the default unnoticed. It is True unless a rule
    says otherwise, because a backend's predicate usually names ops; ``size_guard`` reads only
    sizes.

    ``needs_folded_consumers`` makes a fold rule conditional: it folds a call only where every
    call that reads the result folds too. A rule cannot know that when the planner asks it (the
    consumers come later in the graph), so the planner checks it on the finished plan and plans
    again without the rule for the calls where it failed, which then go to the next rule. A step
    of a chain (the ``dequantize`` of a ``dequantize -> quantize`` requantize pair) thus folds
    only as part of the whole chain, never into a float constant that a kept consumer reads.
    """

    name: str
    action: Action
    description: str
    matches: Callable[[CallView], bool]
    reads_ops: bool = True
    needs_folded_consumers: bool = False

    def __post_init__(self) -> None:
        # Checked here, not when the rule first matches: a string action ("fold") would otherwise
        # silently act as a keep, and the report would blame the policy for it.
        if not isinstance(self.name, str) or not self.name:
            raise PreconditionError(f"a Rule needs a non-empty string name, got {self.name!r}")
        if self.action not in (Action.FOLD, Action.KEEP):
            raise PreconditionError(
                f"rule {self.name!r}: action must be Action.FOLD or Action.KEEP, got "
                f"{type(self.action).__name__} {self.action!r}; hint: from fold_guard import Action"
            )
        if not callable(self.matches):
            raise PreconditionError(
                f"rule {self.name!r}: matches must be a callable taking a CallView and returning "
                f"a bool, got {type(self.matches).__name__} {self.matches!r}"
            )
        if self.needs_folded_consumers and self.action is not Action.FOLD:
            raise PreconditionError(
                f"rule {self.name!r}: needs_folded_consumers makes a fold conditional, but the "
                "rule keeps; hint: drop needs_folded_consumers from a keep rule"
            )

    def __str__(self) -> str:
        return f"{self.name} ({self.action.value}): {self.description}"

    def applies_to(self, call: CallView, policy_name: str) -> bool:
        """Whether the rule matches ``call``; a predicate that raises or is not boolean is an error.

        A user's predicate is arbitrary code, so its failures are turned into a
        :class:`PolicyRuleError` naming the policy, the rule and the call (a bare
        ``ZeroDivisionError`` from deep inside a pass names none of them). Only ``bool`` (and
        NumPy's 0-d boolean) counts as an answer: ``"no"`` is truthy and an array has no truth
        value, so either would decide by accident.
        """
        where = f"policy {policy_name!r}, rule {self.name!r}, on {call.node.function}: {call.node.label} = {call.op}"
        try:
            answer = self.matches(call)
        except Exception as err:
            raise PolicyRuleError(
                f"{where}: the predicate raised {type(err).__name__}: {err}"
            ) from err
        if isinstance(answer, bool):
            return answer
        if getattr(answer, "shape", None) == () and str(getattr(answer, "dtype", "")) == "bool":
            return bool(answer)  # a NumPy bool scalar, e.g. from np.all(...)
        raise PolicyRuleError(
            f"{where}: the predicate returned {type(answer).__name__} {answer!r:.60}, not a bool; "
            "hint: return True (the rule applies) or False"
        )


#: The rule name decisions refused by a memory budget carry.
BUDGET_RULE = "max_fold_bytes"


@dataclass(frozen=True)
class FoldPolicy:
    """An ordered tuple of rules; the first matching rule decides, else the IR's default.

    ``max_fold_bytes`` is an absolute budget: a call whose results would take more bytes is never
    evaluated, whatever the rules, the IR's default or a ``fold_allow`` say (only a barrier ranks
    above it). ``None``, the default, is no budget, so ``default`` keeps stock's behaviour.

    >>> policy = FoldPolicy("keep-exp", "never fold exp", (
    ...     Rule("keep-exp", Action.KEEP, "exp stays", lambda call: call.op.endswith("exp")),))
    >>> [str(rule) for rule in policy.rules]
    ['keep-exp (keep): exp stays']
    """

    name: str
    description: str
    rules: Tuple[Rule, ...] = ()
    max_fold_bytes: Optional[int] = None

    def __post_init__(self) -> None:
        _check_budget(self.max_fold_bytes)
        if not isinstance(self.rules, tuple) or not all(
            isinstance(rule, Rule) for rule in self.rules
        ):
            bad = (
                self.rules
                if not isinstance(self.rules, tuple)
                else next(r for r in self.rules if not isinstance(r, Rule))
            )
            raise PreconditionError(
                f"policy {self.name!r}: rules must be a tuple of Rule objects, got "
                f"{type(bad).__name__} {bad!r:.60}; hint: rules=(Rule(name, Action.KEEP, description, predicate),)"
            )

    @property
    def reads_ops(self) -> bool:
        """True when some rule decides from op names (see :attr:`Rule.reads_ops`)."""
        return any(rule.reads_ops for rule in self.rules)

    def decide(
        self, call: CallView, *, skip_conditional: bool = False
    ) -> Optional[Tuple[Action, Rule]]:
        """The action and the rule that chose it, or None when no rule has an opinion.

        ``skip_conditional`` passes over the rules with ``needs_folded_consumers`` (the planner
        asks so for a call whose consumers did not all fold). Raises :class:`PolicyRuleError`
        when a rule's predicate raises or does not return a bool.
        """
        for rule in self.rules:
            if skip_conditional and rule.needs_folded_consumers:
                continue
            if rule.applies_to(call, self.name):
                return rule.action, rule
        return None

    def describe(self) -> str:
        lines = [f"{self.name}: {self.description}"]
        lines += [f"  - {rule}" for rule in self.rules] or [
            "  (no rules: the IR's default decides)"
        ]
        return "\n".join(lines)


def compose(*policies: FoldPolicy, name: Optional[str] = None) -> FoldPolicy:
    """One policy whose rules are those of ``policies`` in order (earlier policies win).

    >>> compose(KEEP_QDQ_WEIGHTS_POLICY, SIZE_GUARD_POLICY).name
    'keep-qdq-weights+size-guard'
    """
    if not policies:
        raise PreconditionError("compose() needs at least one policy")
    rules = tuple(rule for policy in policies for rule in policy.rules)
    joined = name or "+".join(policy.name for policy in policies)
    description = "; then ".join(policy.description for policy in policies)
    # the tightest budget wins: each policy's budget is a limit, never a permission
    budgets = [policy.max_fold_bytes for policy in policies if policy.max_fold_bytes is not None]
    return FoldPolicy(joined, description, rules, min(budgets) if budgets else None)


def _check_budget(max_fold_bytes: object) -> None:
    if max_fold_bytes is None:
        return
    if (
        not isinstance(max_fold_bytes, numbers.Integral)
        or isinstance(max_fold_bytes, bool)
        or max_fold_bytes < 0
    ):
        raise PreconditionError(
            f"max_fold_bytes must be a byte count (an int >= 0) or None, got {type(max_fold_bytes).__name__} "
            f"{max_fold_bytes!r}; hint: max_fold_bytes=256 * 2**20 for 256 MiB"
        )


def memory_budget(max_fold_bytes: int, *, name: Optional[str] = None) -> FoldPolicy:
    """A policy with no rules and an absolute budget: compose it with others to cap any fold.

    >>> compose(KEEP_QDQ_WEIGHTS_POLICY, memory_budget(2**20)).max_fold_bytes
    1048576
    """
    _check_budget(max_fold_bytes)
    return FoldPolicy(
        name or f"max-fold-bytes-{max_fold_bytes}",
        f"never evaluate a call whose results take more than {max_fold_bytes} bytes",
        (),
        int(max_fold_bytes),
    )


def with_budget(spec: PolicySpec, max_fold_bytes: Optional[int]) -> FoldPolicy:
    """``spec`` resolved, with ``max_fold_bytes`` as its budget (the tighter one if it has one).

    The policy keeps its name, so reports still say which policy decided.
    """
    policy = resolve_policy(spec)
    _check_budget(max_fold_bytes)
    if max_fold_bytes is None:
        return policy
    budgets = [int(max_fold_bytes)] + (
        [policy.max_fold_bytes] if policy.max_fold_bytes is not None else []
    )
    return FoldPolicy(policy.name, policy.description, policy.rules, min(budgets))


def _is_dequantize_of_integer(call: CallView) -> bool:
    if call.op not in DEQUANTIZE_OPS or not call.input_dtypes:
        return False
    dtype = call.input_dtypes[0] or ""
    return dtype.startswith("int") or dtype.startswith("uint")


def _reads_only_as_quantize_data(call: CallView) -> bool:
    """Every call that reads the result is a quantize, reading it as its data (first) operand."""
    consumers = call.uses.consumers[call.node.id]
    return bool(consumers) and all(
        _is_quantize_of(call.graph.nodes[user], call.node.id) for user in consumers
    )


def _is_quantize_of(user: FoldNode, source: int) -> bool:
    if user.op not in QUANTIZE_OPS or not user.inputs:
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
    if call.op not in CAST_OPS or len(call.input_dtypes) != 1 or len(call.outputs) != 1:
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

    A call is kept when its result takes at least ``min_result_bytes`` and more than
    ``growth_factor`` times the bytes of its constant inputs (so ``zeros((1024, 1024))``, a
    broadcast of a scalar, or a ``tile`` stay as run-time ops).

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
        if result is None or result < min_result_bytes:
            return False
        return result > growth_factor * call.constant_input_nbytes

    rule = Rule(
        name,
        Action.KEEP,
        f"keep a fold whose result is >= {min_result_bytes} bytes and more than "
        f"{growth_factor:g}x the bytes of its constant inputs",
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
    "dequantize of an integer constant stays, so backends can match weight Q/DQ patterns",
    _is_dequantize_of_integer,
)
_FOLD_QUANTIZE_OF_CONSTANT = Rule(
    "fold-quantize-of-constant",
    Action.FOLD,
    "quantize of a constant becomes an integer constant",
    lambda call: call.op in QUANTIZE_OPS,
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

PolicySpec = Union[str, FoldPolicy, Sequence[Union[str, FoldPolicy]]]

_BUILTINS = (
    DEFAULT_POLICY,
    FOLD_QNN_POLICY,
    KEEP_LOW_PRECISION_WEIGHTS_POLICY,
    KEEP_QDQ_WEIGHTS_POLICY,
    KEEP_REQUANTIZE_POLICY,
    QDQ_ACCELERATOR_POLICY,
    SIZE_GUARD_POLICY,
    WEIGHTS_ONLY_POLICY,
)
_REGISTRY: Dict[str, FoldPolicy] = {policy.name: policy for policy in _BUILTINS}


def register_policy(
    policy: FoldPolicy, *, name: Optional[str] = None, replace: bool = False
) -> FoldPolicy:
    """Register ``policy`` under ``name`` (default ``policy.name``); return it.

    A name that is already registered is an error unless ``replace=True``.

    >>> with policy_registry_scope():
    ...     _ = register_policy(size_guard(2.0, name="my-npu"))
    ...     get_policy("my-npu").name
    'my-npu'
    """
    if not isinstance(policy, FoldPolicy):
        raise PreconditionError(
            f"register_policy expects a FoldPolicy, got {type(policy).__name__}; "
            "build one with FoldPolicy(name, description, rules) or compose(...)"
        )
    key = name or policy.name
    if key in _REGISTRY and not replace:
        raise PreconditionError(
            f"a policy named {key!r} is already registered; pass replace=True to override it"
        )
    if key != policy.name:
        policy = FoldPolicy(key, policy.description, policy.rules, policy.max_fold_bytes)
    _REGISTRY[key] = policy
    return policy


def unregister_policy(name: str) -> None:
    """Remove a registered policy (built-ins included; use policy_registry_scope in tests)."""
    if name not in _REGISTRY:
        raise UnknownPolicyError(_unknown_message(name))
    del _REGISTRY[name]


def get_policy(name: str) -> FoldPolicy:
    """The policy registered under ``name``; UnknownPolicyError lists the known names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownPolicyError(_unknown_message(name)) from None


def list_policies() -> Tuple[FoldPolicy, ...]:
    """Every registered policy, sorted by name (``policy.describe()`` lists its rules)."""
    return tuple(_REGISTRY[name] for name in sorted(_REGISTRY))


def resolve_policy(spec: PolicySpec) -> FoldPolicy:
    """Turn a name, a FoldPolicy, or a sequence of both (composed in order) into one FoldPolicy.

    >>> resolve_policy(["keep-qdq-weights", "size-guard"]).name
    'keep-qdq-weights+size-guard'
    """
    if isinstance(spec, FoldPolicy):
        return spec
    if isinstance(spec, str):
        return get_policy(spec)
    if isinstance(spec, (list, tuple)) and spec:
        return compose(*(resolve_policy(item) for item in spec))
    raise PreconditionError(
        f"policy must be a registered name, a FoldPolicy or a non-empty list of them, got {spec!r}; "
        f"known names: {', '.join(sorted(_REGISTRY))}"
    )


@contextlib.contextmanager
def policy_registry_scope() -> Iterator[None]:
    """Restore the registry to its current contents on exit (for tests and notebooks)."""
    saved = dict(_REGISTRY)
    try:
        yield
    finally:
        _REGISTRY.clear()
        _REGISTRY.update(saved)


def _unknown_message(name: str) -> str:
    close = difflib.get_close_matches(str(name), list(_REGISTRY), n=1, cutoff=0.6)
    suggestion = f"did you mean {close[0]!r}? " if close else ""
    return (
        f"unknown fold policy {name!r}; {suggestion}registered policies: {', '.join(sorted(_REGISTRY))}. "
        "Register a backend policy with fold_guard.register_policy(FoldPolicy(...)) first"
    )
