"""The TVM-free core of fold_guard: the graph view, the policies and the planner.

Nothing here imports ``tvm``; the Relax and Relay adapters translate their IR into a
:class:`FoldGraph`, call :func:`plan_folds`, and apply the resulting :class:`FoldPlan`.
"""

from .annotate import Annotated, Placement, allow_roots, placements
from .builtin_policies import (
    DEFAULT_GROWTH_FACTOR,
    DEFAULT_MIN_RESULT_BYTES,
    DEFAULT_POLICY,
    DEQUANTIZE_OPS,
    FOLD_QNN_POLICY,
    KEEP_QDQ_WEIGHTS_POLICY,
    QDQ_ACCELERATOR_POLICY,
    QUANTIZE_OPS,
    SIZE_GUARD_POLICY,
    WEIGHTS_ONLY_POLICY,
    size_guard,
)
from .errors import (
    ConflictingAnnotationsError,
    FoldGuardError,
    FoldNotPossibleError,
    PlanInvariantError,
    PolicyRuleError,
    PreconditionError,
    UnknownPolicyError,
    UnsupportedIRError,
)
from .graph import Annotation, FoldGraph, FoldNode, InputKind, NodeInput, TensorInfo, dtype_nbytes
from .ledger import LedgerRow
from .offload_report import OffloadReason, OffloadReport, OffloadRow
from .planner import ALLOW_RULE, BARRIER_RULE, DEFAULT_RULE, FoldDecision, FoldPlan, plan_folds
from .policy import CallView, FoldPolicy, Rule, compose, memory_budget
from .reasons import Action, Reason
from .registry import (
    PolicySpec,
    get_policy,
    list_policies,
    policy_registry_scope,
    register_policy,
    resolve_policy,
    unregister_policy,
)
from .report import FoldReport

__all__ = [
    "ALLOW_RULE",
    "BARRIER_RULE",
    "DEFAULT_GROWTH_FACTOR",
    "DEFAULT_MIN_RESULT_BYTES",
    "DEFAULT_POLICY",
    "DEFAULT_RULE",
    "DEQUANTIZE_OPS",
    "FOLD_QNN_POLICY",
    "KEEP_QDQ_WEIGHTS_POLICY",
    "QDQ_ACCELERATOR_POLICY",
    "QUANTIZE_OPS",
    "SIZE_GUARD_POLICY",
    "WEIGHTS_ONLY_POLICY",
    "Action",
    "Annotated",
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
    "LedgerRow",
    "NodeInput",
    "OffloadReason",
    "OffloadReport",
    "OffloadRow",
    "Placement",
    "PlanInvariantError",
    "PolicyRuleError",
    "PolicySpec",
    "PreconditionError",
    "Reason",
    "Rule",
    "TensorInfo",
    "UnknownPolicyError",
    "UnsupportedIRError",
    "allow_roots",
    "compose",
    "dtype_nbytes",
    "get_policy",
    "list_policies",
    "memory_budget",
    "placements",
    "plan_folds",
    "policy_registry_scope",
    "register_policy",
    "resolve_policy",
    "size_guard",
    "unregister_policy",
]
