"""fold_guard for Relax (apache-tvm 0.27).

Importing this module registers the ``relax.fold_barrier`` and ``relax.fold_allow`` ops (again
is harmless) and teaches TVMScript to parse ``R.fold_barrier(x)`` / ``R.fold_allow(x)``.

>>> import fold_guard.relax as fgr
>>> sorted(name for name in fgr.__all__ if name[0].isupper())  # doctest: +NORMALIZE_WHITESPACE
['EngineOptions', 'FoldConstant', 'FoldPlan', 'FoldResult',
 'LedgerRow', 'OffloadReason', 'OffloadReport', 'OffloadRow', 'ReleaseBarriers']
"""

# Never import tvm next to tvm_tirx (apache-tvm-tirx): the process would abort; say so instead.
from .._tvm.cores import check_no_second_core as _check_no_second_core

_check_no_second_core()

# Importing _compat refuses a TVM release this adapter does not know (UnsupportedIRError).
from ._compat import register_errors_with_ffi as _register_errors_with_ffi  # noqa: E402

_register_errors_with_ffi()

from ._annotate import annotate  # noqa: E402
from ._engine import EngineOptions  # noqa: E402
from ._ledger import constant_key, ledger  # noqa: E402
from ._offload import backend_policy, explain_offload  # noqa: E402
from ._offload.patterns import absorb_weight_dequantize, dequantized_constant  # noqa: E402
from ._ops import fold_allow, fold_barrier  # noqa: E402
from ._ops import register_ops as _register_ops  # noqa: E402
from ._pass import FoldConstant, FoldResult, fold, plan  # noqa: E402
from ._release import ReleaseBarriers, partition, release_barriers  # noqa: E402

_register_ops()

from .._core import FoldPlan, LedgerRow, OffloadReason, OffloadReport, OffloadRow  # noqa: E402

__all__ = [
    "EngineOptions",
    "FoldConstant",
    "FoldPlan",
    "FoldResult",
    "LedgerRow",
    "OffloadReason",
    "OffloadReport",
    "OffloadRow",
    "ReleaseBarriers",
    "absorb_weight_dequantize",
    "annotate",
    "backend_policy",
    "constant_key",
    "dequantized_constant",
    "explain_offload",
    "fold",
    "fold_allow",
    "fold_barrier",
    "ledger",
    "partition",
    "plan",
    "release_barriers",
]
