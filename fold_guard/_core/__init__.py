"""The TVM-free core of fold_guard: the graph view, the policies and the planner.

Nothing here imports ``tvm``; the Relax and Relay adapters translate their IR into a
:class:`FoldGraph`, call :func:`plan_folds`, and apply the resulting :class:`FoldPlan`.
"""

from .annotate import allow_roots
from .errors import (
    ConflictingAnnotationsError,
    FoldGuardError,
    FoldNotPossibleError,
    PlanInvariantError,
    PreconditionError,
    UnknownPolicyError,
    UnsupportedIRError,
)
from .graph import Annotation, FoldGraph, FoldNode, InputKind, NodeInput, TensorInfo, dtype_nbytes
from .planner import ALLOW_RULE, BARRIER_RULE, DEFAULT_RULE, FoldDecision, FoldPlan, plan_folds
from .policy import (
    DEFAULT_GROWTH_FACTOR,
    DEFAULT_MIN_RESULT_BYTES,
    DEFAULT_POLICY,
    DEQUANTIZE_OPS,
    FOLD_QNN_POLICY,
    KEEP_QDQ_WEIGHTS_POLICY,
    QUANTIZE_OPS,
    SIZE_GUARD_POLICY,
    CallView,
    FoldPolicy,
    PolicySpec,
    Rule,
    compose,
    get_policy,
    list_policies,
    policy_registry_scope,
    register_policy,
    resolve_policy,
    size_guard,
    unregister_policy,
)
from .reasons import Action, Reason
from .report import FoldReport

__all__ = [
    "ALLOW_RULE",
    "BARRIER_RULE",
    "DEFAULT_RULE",
    "DEFAULT_GROWTH_FACTOR",
    "DEFAULT_MIN_RESULT_BYTES",
    "DEFAULT_POLICY",
    "DEQUANTIZE_OPS",
    "FOLD_QNN_POLICY",
    "KEEP_QDQ_WEIGHTS_POLICY",
    "QUANTIZE_OPS",
    "SIZE_GUARD_POLICY",
    "Action",
    "allow_roots",
    "Annotation",
    "CallView",
    "ConflictingAnnotationsError",
    "FoldDecision",
    "FoldGraph",
    "FoldGuardError",
    "FoldNode",
    "FoldNotPossibleError",
    "FoldPlan",
    "FoldPolicy",
    "FoldReport",
    "InputKind",
    "NodeInput",
    "PlanInvariantError",
    "PolicySpec",
    "PreconditionError",
    "Reason",
    "Rule",
    "TensorInfo",
    "UnknownPolicyError",
    "UnsupportedIRError",
    "compose",
    "dtype_nbytes",
    "get_policy",
    "list_policies",
    "plan_folds",
    "policy_registry_scope",
    "register_policy",
    "resolve_policy",
    "size_guard",
    "unregister_policy",
]
