"""Fold policies as data: the view a rule sees of a call, rules, and policies built of rules.

A policy only ever sees calls whose inputs are all constant (the planner asks nothing else), so a
rule such as "keep dequantize of an integer tensor" means "keep dequantize of an integer
*constant*". The first rule that matches decides; when none matches the IR's default applies
(what the stock ``FoldConstant`` of that IR would do). Policies compose by concatenating rules.

The built-in policies are in :mod:`fold_guard._core.builtin_policies`, the registry of named
policies in :mod:`fold_guard._core.registry`.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Tuple

from .errors import PolicyRuleError, PreconditionError
from .graph import FoldGraph, FoldNode, InputKind, TensorInfo
from .kernel_names import kernel_role
from .reasons import Action
from .uses import GraphUses

__all__ = [
    "BUDGET_RULE",
    "CallView",
    "FoldPolicy",
    "Rule",
    "ask",
    "check_budget",
    "compose",
    "memory_budget",
]


class CallView:
    """What a policy rule sees of one constant call: op, attributes, inputs, outputs, uses.

    "Constant" includes weights passed as parameters (Relax ``num_input``): a rule decides the
    same whether a weight is a constant (its verdict is a fold or a keep) or a parameter (a
    lift ahead of run time or a keep); :attr:`reads_parameters` tells the two apart.

    **Lowered calls.** A call into a kernel (Relax ``call_tir`` of a PrimFunc, after
    ``LegalizeOps`` or from a quantizer such as MLC-LLM's) has ``op == "relax.call_tir"``;
    :attr:`lowered` is True, :attr:`callee` names the kernel (the PrimFunc's ``global_symbol``,
    else its ``GlobalVar`` name), :attr:`op_pattern` is its ``op_pattern`` attribute where
    ``AnnotateTIROpPattern`` set one (else None), and :attr:`kernel_role` is what the kernel's
    name says it computes (``"dequantize"``, ``"quantize"``, ``"cast"``, ...; the list is
    :mod:`fold_guard._core.kernel_names`). The inputs are the kernel's tensor operands (the
    fields of call_tir's tuple argument, packed ``uint32`` / ``int8`` / ``int4`` / ``float8``
    included): :attr:`input_dtypes`, :attr:`input_tensors` (shapes, bytes) and
    :meth:`input_is_constant_literal`; :attr:`outputs` are its results. A lowered call has no
    operator attributes: reading :attr:`attrs` of one is a :class:`PreconditionError`.

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
        """The operator's attributes; a lowered call has none to read (it is a kernel call)."""
        if self.node.lowered:
            raise PreconditionError(
                f"function {self.node.function}: {self.node.label} = {self.op}({self.callee}) is "
                "a call into a kernel, not an operator: it has no operator attributes to read. "
                "Hint: decide lowered calls by call.callee / call.kernel_role and the operands' "
                "dtypes, or annotate before LegalizeOps"
            )
        return self.node.attrs

    @property
    def lowered(self) -> bool:
        """True for a call into a kernel (``call_tir``, ``call_dps_packed``, ...), not an operator."""
        return self.node.lowered

    @property
    def callee(self) -> str:
        """The kernel a lowered call calls (PrimFunc ``global_symbol`` / ``GlobalVar`` name, or the
        extern's name); "" for an operator call."""
        return self.node.callee

    @property
    def op_pattern(self) -> Optional[int]:
        """The kernel's ``op_pattern`` (TVM ``OpPatternKind``) where ``AnnotateTIROpPattern`` set it."""
        return self.node.op_pattern

    @property
    def kernel_role(self) -> Optional[str]:
        """What a lowered call's kernel name says it computes (:func:`~fold_guard._core.kernel_names.kernel_role`)."""
        return kernel_role(self.node.callee) if self.node.lowered else None

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
        """The bytes of the inputs the call reads (not one whose static type alone it reads)."""
        return sum(
            inp.tensor.nbytes or 0
            for inp in self.node.inputs
            if inp.tensor is not None and inp.reads_value
        )

    @property
    def largest_input_nbytes(self) -> int:
        """The bytes of the largest input the call reads (0 for none): the weight of a
        ``dequantize(W, scale, zero_point)``, whose scales do not make it any smaller."""
        return max(
            (
                inp.tensor.nbytes or 0
                for inp in self.node.inputs
                if inp.tensor is not None and inp.reads_value
            ),
            default=0,
        )

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

    @property
    def feeds_a_weight(self) -> bool:
        """True when some use of the result, through other constant calls, is a weight or bias
        input of conv / matmul / dense (see :mod:`fold_guard._core.uses`)."""
        return self.uses.feeds_a_weight(self.node.id)

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
    rule may not recognise a lowered kernel call (``call.op`` is ``relax.call_tir``; the kernel is
    ``call.callee``): where no rule of a policy that reads op names answers for a lowered call,
    the report says the call was not recognised and the policy's ``lowered_fallback`` decides.
    It is True unless a rule says otherwise, because a backend's predicate usually names ops;
    ``size_guard`` reads only sizes.

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
        except PreconditionError:
            raise  # the view refused a question it cannot answer (CallView.attrs of a kernel call)
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
    lowered_fallback: Optional[Action] = None

    def __post_init__(self) -> None:
        check_budget(self.max_fold_bytes)
        if self.lowered_fallback not in (None, Action.KEEP):
            raise PreconditionError(
                f"policy {self.name!r}: lowered_fallback must be None (the IR's default) or "
                f"Action.KEEP, got {self.lowered_fallback!r}"
            )
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

    >>> from fold_guard._core.builtin_policies import KEEP_QDQ_WEIGHTS_POLICY, SIZE_GUARD_POLICY
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
    # likewise a keep for unrecognised kernels is a limit: one policy asking for it is enough
    keep = any(policy.lowered_fallback is Action.KEEP for policy in policies)
    return FoldPolicy(
        joined,
        description,
        rules,
        min(budgets) if budgets else None,
        Action.KEEP if keep else None,
    )


def check_budget(max_fold_bytes: object) -> None:
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

    >>> from fold_guard._core.builtin_policies import KEEP_QDQ_WEIGHTS_POLICY
    >>> compose(KEEP_QDQ_WEIGHTS_POLICY, memory_budget(2**20)).max_fold_bytes
    1048576
    """
    check_budget(max_fold_bytes)
    return FoldPolicy(
        name or f"max-fold-bytes-{max_fold_bytes}",
        f"never evaluate a call whose results take more than {max_fold_bytes} bytes",
        (),
        int(max_fold_bytes),
    )


def ask(
    policy: FoldPolicy, call: CallView, *, skip_conditional: bool = False
) -> Optional[Tuple[Action, Rule]]:
    """``policy.decide(call)``, checked: None or ``(Action, Rule)``, else :class:`PolicyRuleError`.

    A subclass may override ``decide``; what it returns is checked here, so a wrong answer
    names the policy instead of failing deep in the planner.
    """
    node = call.node
    # Asked without the keyword unless needed: a subclass's decide(call) keeps working.
    verdict = (
        policy.decide(call, skip_conditional=True) if skip_conditional else policy.decide(call)
    )
    if verdict is None:
        return None
    if (
        isinstance(verdict, tuple)
        and len(verdict) == 2
        and verdict[0] in (Action.FOLD, Action.KEEP)
        and isinstance(verdict[1], Rule)
    ):
        return verdict
    raise PolicyRuleError(
        f"policy {policy.name!r} ({type(policy).__name__}.decide) returned {verdict!r} for "
        f"{node.label} = {node.op} in function {node.function}; hint: decide must return None "
        "(no opinion) or a pair (Action, Rule), the rule that chose the action"
    )
