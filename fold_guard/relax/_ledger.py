"""The precision ledger of a Relax module: written by ``fold`` / ``annotate``, read by :func:`ledger`.

The rows come from the TVM-free core (:mod:`fold_guard._core.ledger`); this module only keys them
(a constant by :func:`~fold_guard._core.ledger.content_key` of its dtype, shape and bytes, a
weight parameter by its name: a variable's name is not a key, passes rename them). The attribute
(:mod:`fold_guard._tvm.ledger_attr`) survives ``tvm.ir.save_json`` / ``load_json`` and TVM's
pipelines (``relax.get_pipeline("zero")`` / ``"default"``, ``LiftTransformParams``).
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Tuple

import tvm
from tvm import relax

from .._core.ledger import LedgerRow, content_key, ledger_rows
from .._core.planner import FoldPlan
from .._tvm.ledger_attr import read_ledger, write_ledger
from . import _compat
from ._sites import CallSite

__all__ = ["attach_ledger", "constant_key", "ledger"]


def constant_key(const: Any) -> str:
    """The content key of a Relax constant (``sha256:<16 hex digits>``): a ledger row's ``key``.

    >>> import numpy as np
    >>> from tvm import relax
    >>> import fold_guard.relax as fgr
    >>> fgr.constant_key(relax.const(np.ones((4, 4), "int8")))
    'sha256:bef79c0aacebb5cf'
    """
    array = _compat.constant_array(const).numpy()
    return content_key(str(array.dtype), array.shape, array.tobytes())


def _weight_key(sites: Sequence[CallSite]) -> Any:
    def key(node_id: int, index: int) -> Optional[str]:
        site = sites[node_id]
        if index >= len(site.leaves):
            return None
        constant = site.leaf_constants[index] if index < len(site.leaf_constants) else None
        if constant is not None and _compat.is_constant(constant):
            return constant_key(constant)
        leaf = site.leaves[index]
        if constant is None and isinstance(leaf, relax.Var):
            # a weight parameter: LiftTransformParams keeps its name in the transform function
            return "param:" + _compat.var_name(leaf)
        return None

    return key


def attach_ledger(
    mod: tvm.IRModule,
    plan: FoldPlan,
    sites: Sequence[CallSite],
    layers: Optional[Mapping[Tuple[str, str], str]] = None,
) -> tvm.IRModule:
    """``mod`` with the plan's rows added to its ledger attribute (rows already there stay)."""
    weight_key = _weight_key(sites)
    rows = ledger_rows(plan, weight_key, layers)
    return write_ledger(mod, rows)


def ledger(mod: tvm.IRModule) -> List[LedgerRow]:
    """The precision ledger ``fold`` / ``annotate`` (``ledger=True``) wrote into ``mod``.

    One :class:`~fold_guard.LedgerRow` per weight: its content key, source layer,
    dtype, shape and bytes before and after, the action (``folded`` / ``kept`` / ``lifted``) and
    the rule that decided. Empty for a module without a ledger.

    Examples
    --------
    >>> import numpy as np
    >>> import tvm
    >>> from tvm import relax
    >>> import fold_guard.relax as fgr
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    >>> w = relax.const(np.ones((4, 4), "int8"))
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         dq = bb.emit(relax.op.dequantize(w, relax.const(0.5), relax.const(0, "int8")))
    ...         y = bb.emit_output(relax.op.matmul(x, dq))
    ...     _ = bb.emit_func_output(y)
    >>> mod = fgr.fold(bb.get(), policy="keep-qdq-weights", ledger=True).mod
    >>> [row.brief() for row in fgr.ledger(tvm.ir.load_json(tvm.ir.save_json(mod)))]
    ['sha256:bef79c0aacebb5cf: kept int8[4, 4] -> int8[4, 4] [keep-dequantize-of-integer-constant]']
    """
    return read_ledger(mod)
