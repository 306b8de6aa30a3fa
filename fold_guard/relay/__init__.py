"""fold_guard for Relay (TVM 0.9 - 0.19 builds with Relay; reference build ``hhb-tvm==3.2.3``).

Importing this module registers the Relay ops ``fold_barrier`` and ``fold_allow`` (again is
harmless). ``import fold_guard`` does not import it: Relay exists only in older TVM builds, so
the adapter is optional and loaded on request.

Public surface:

- ``FoldConstant(policy="default", *, strict=False, functions=None) -> tvm.transform.Pass``
- ``plan(mod, policy="default", *, functions=None) -> FoldPlan``
- ``fold(mod, *, policy="default", strict=False, functions=None, ledger=False) -> FoldResult``;
  ``ledger(mod)`` reads the precision ledger ``ledger=True`` writes into the module (one
  ``LedgerRow`` per weight, keyed by ``constant_key``)
- ``fold_function(func, *, policy="default", strict=False) -> relay.Function`` for one function
  as a ``relay.ext.<codegen>`` hook receives it (``Compiler`` attribute included)
- ``fold_barrier(expr)`` / ``fold_allow(expr)``
- ``annotate(mod, *, policy="qdq-accelerator", params=None) -> Annotated``: bind a frontend's
  params and place the ``fold_allow`` / ``fold_barrier`` that make any later fold follow
  ``policy``; ``.mod`` is the new module, ``.placed`` what was placed
- ``release_barriers(mod)`` / ``ReleaseBarriers()`` and ``partition(mod, partition_fn) ->
  Partitioned``: right before a backend's partitioner, the barriers go and nothing folds
- ``backend_policy(table)`` / ``explain_offload(mod, table)``: the fold a backend's pattern
  table asks for, and why each layer was (not) offloaded
- ``allow_constant_qnn(mod) -> IRModule``: wrap the constant QNN subgraphs
  ``FakeQuantizationToInteger`` leaves in ``fold_allow``

>>> import fold_guard.relay as fgr
>>> sorted(name for name in fgr.__all__ if name[0].isupper())  # doctest: +NORMALIZE_WHITESPACE
['FoldConstant', 'FoldPlan', 'FoldResult', 'LedgerRow',
 'OffloadReason', 'OffloadReport', 'OffloadRow', 'ReleaseBarriers']
"""

# Never import tvm next to tvm_tirx (apache-tvm-tirx): the process would abort; say so instead.
from .._tvm.cores import check_no_second_core as _check_no_second_core

_check_no_second_core()

# Importing _compat refuses a TVM without Relay, or a release this adapter does not know.
from ._compat import check_tvm_version as _check_tvm_version  # noqa: E402

_check_tvm_version()

from ._ops import fold_allow, fold_barrier  # noqa: E402
from ._ops import register_ops as _register_ops  # noqa: E402

_register_ops()

from .._core import FoldPlan, LedgerRow, OffloadReason, OffloadReport, OffloadRow  # noqa: E402
from ._annotate import allow_constant_qnn, annotate  # noqa: E402
from ._ledger import constant_key, ledger  # noqa: E402
from ._offload import backend_policy, explain_offload  # noqa: E402
from ._pass import FoldConstant, FoldResult, fold, fold_function, plan  # noqa: E402
from ._release import ReleaseBarriers, partition, release_barriers  # noqa: E402

__all__ = [
    "FoldConstant",
    "FoldPlan",
    "FoldResult",
    "LedgerRow",
    "OffloadReason",
    "OffloadReport",
    "OffloadRow",
    "ReleaseBarriers",
    "allow_constant_qnn",
    "annotate",
    "backend_policy",
    "constant_key",
    "explain_offload",
    "fold",
    "fold_allow",
    "fold_barrier",
    "fold_function",
    "ledger",
    "partition",
    "plan",
    "release_barriers",
]
