"""fold_guard: per-subgraph control over constant folding in Apache TVM.

Two annotation ops, ``fold_barrier`` (never fold across here) and ``fold_allow`` (evaluate this
constant subgraph even where the policy or the IR's default would keep it), and a ``FoldConstant``
pass that honours them together with named policies.

The IR adapters are submodules. Where a supported TVM is installed, ``import fold_guard`` also
imports ``fold_guard.relax``, which registers the annotation ops, so TVMScript that uses
``R.fold_barrier`` / ``R.fold_allow`` parses after ``import fold_guard``. Without TVM (or with a
TVM release the adapter does not support) the TVM-free core still imports; importing
``fold_guard.relax`` directly then says what is missing. The Relay adapter is never imported
implicitly (Relay exists only in older TVM builds); import it by name::

    import fold_guard.relax   # Relax (apache-tvm 0.27)
    import fold_guard.relay   # Relay (TVM 0.9 to 0.19 builds, e.g. hhb-tvm 3.2.3)

>>> import fold_guard
>>> [policy.name for policy in fold_guard.list_policies()][:2]
['default', 'fold-qnn']
"""

import sys

from ._core import (
    DEFAULT_GROWTH_FACTOR,
    DEFAULT_MIN_RESULT_BYTES,
    Action,
    Annotated,
    Annotation,
    CallView,
    ConflictingAnnotationsError,
    FoldDecision,
    FoldGuardError,
    FoldNotPossibleError,
    FoldPlan,
    FoldPolicy,
    FoldReport,
    LedgerRow,
    OffloadReason,
    OffloadReport,
    OffloadRow,
    Placement,
    PlanInvariantError,
    PolicyRuleError,
    PreconditionError,
    Reason,
    Rule,
    UnknownPolicyError,
    UnsupportedIRError,
    compose,
    get_policy,
    list_policies,
    memory_budget,
    policy_registry_scope,
    register_policy,
    size_guard,
    unregister_policy,
)
from ._tvm.cores import guard_tirx_import as _guard_tirx_import
from ._tvm.cores import warn_about_conflict as _warn_about_conflict
from ._version import __version__

__all__ = [
    "DEFAULT_GROWTH_FACTOR",
    "DEFAULT_MIN_RESULT_BYTES",
    "Action",
    "Annotated",
    "Annotation",
    "CallView",
    "ConflictingAnnotationsError",
    "FoldDecision",
    "FoldGuardError",
    "FoldNotPossibleError",
    "FoldPlan",
    "FoldPolicy",
    "FoldReport",
    "LedgerRow",
    "OffloadReason",
    "OffloadReport",
    "OffloadRow",
    "Placement",
    "PlanInvariantError",
    "PolicyRuleError",
    "PreconditionError",
    "Reason",
    "Rule",
    "UnknownPolicyError",
    "UnsupportedIRError",
    "__version__",
    "compose",
    "get_policy",
    "list_policies",
    "memory_budget",
    "policy_registry_scope",
    "register_policy",
    "size_guard",
    "unregister_policy",
]


def _register_available_adapters() -> None:
    # Optional by design: the core must import without TVM, and a TVM build without Relax (or an
    # unsupported release) only means the Relax adapter is unavailable, which importing
    # fold_guard.relax explicitly reports with a hint.
    try:
        from . import relax  # noqa: F401
    except (ImportError, UnsupportedIRError):
        pass


# Before anything imports tvm: apache-tvm-tirx imported or installed beside it is one warning
# line (importing both cores aborts the process), and importing tvm_tirx after fold_guard loaded
# tvm is an ImportError saying so (fold_guard._tvm.cores).
_guard_tirx_import()
_warn_about_conflict()

# ``python -m fold_guard`` imports this package before it runs ``__main__``; while the module is
# being located ``sys.argv[0]`` is "-m" (documented with Python's -m option). The command then
# registers the adapters itself once its arguments parse (``__main__``), so ``--help``,
# ``--version`` and a usage error answer without importing TVM, as the console script does.
if sys.argv[:1] != ["-m"]:
    _register_available_adapters()
