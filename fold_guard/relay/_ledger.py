"""The precision ledger of a Relay module: written by ``fold`` / ``annotate``, read by :func:`ledger`.

As on Relax (:mod:`fold_guard.relax._ledger`): the core's rows, each weight keyed by
:func:`~fold_guard._core.ledger.content_key` of its constant, stored as the ``fold_guard.ledger``
module attribute. On TVM 0.16 (hhb-tvm 3.2.3) ``IRModule.with_attr`` holds the nested maps, and
``save_json`` / ``load_json``, ``InferType``, ``FoldConstant``, ``FakeQuantizationToInteger``,
``PartitionGraph`` and ``relay.optimize`` (the passes of ``relay.build`` before codegen) keep
them. Relay has no parameter lifting: weights are constants (``annotate(..., params=...)``
binds a frontend's params first), so every key is a content hash.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import tvm

from .._core.ledger import LedgerRow, content_key, ledger_rows
from .._core.planner import FoldPlan
from .._tvm.ledger_attr import read_ledger, write_ledger
from ._sites import CallSite, ConstSource, Source, TupleSource

__all__ = ["attach_ledger", "constant_key", "ledger"]


def constant_key(const: Any) -> str:
    """The content key of a Relay constant (``sha256:<16 hex digits>``), as Relax's: a ledger
    row's ``key``.

    >>> import numpy as np
    >>> from tvm import relay
    >>> import fold_guard.relay as fgr
    >>> fgr.constant_key(relay.const(np.ones((4, 4), "int8")))
    'sha256:bef79c0aacebb5cf'
    """
    array = const.data.numpy()
    return content_key(str(array.dtype), array.shape, array.tobytes())


def _leaves(sources: Sequence[Source]) -> List[Source]:
    """The sources in node-input order: tuples flattened, as the walk lists a node's inputs."""
    found: List[Source] = []
    for source in sources:
        if isinstance(source, TupleSource):
            found.extend(_leaves(source.fields))
        else:
            found.append(source)
    return found


def _weight_key(sites: Sequence[CallSite]) -> Callable[[int, int], Optional[str]]:
    leaves = [_leaves(site.args) for site in sites]

    def key(node_id: int, index: int) -> Optional[str]:
        inputs = leaves[node_id]
        if index < len(inputs) and isinstance(inputs[index], ConstSource):
            return constant_key(inputs[index].constant)  # type: ignore[union-attr]
        return None

    return key


def attach_ledger(mod: tvm.IRModule, plan: FoldPlan, sites: Sequence[CallSite]) -> tvm.IRModule:
    """``mod`` with the plan's rows added to its ledger attribute (rows already there stay)."""
    weight_key = _weight_key(sites)
    rows = ledger_rows(plan, weight_key)
    return write_ledger(mod, rows)


def ledger(mod: tvm.IRModule) -> List[LedgerRow]:
    """The precision ledger ``fold`` / ``annotate`` (``ledger=True``) wrote into ``mod``.

    One :class:`~fold_guard.LedgerRow` per weight, as
    :func:`fold_guard.relax.ledger`; empty for a module without a ledger.

    Examples
    --------
    >>> import numpy as np
    >>> import tvm
    >>> from tvm import relay
    >>> import fold_guard.relay as fgr
    >>> x = relay.var("x", shape=(1, 4), dtype="float32")
    >>> w = relay.const(np.ones((4, 4), "int8"))
    >>> dq = relay.qnn.op.dequantize(w, relay.const(0.5), relay.const(0))
    >>> mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.dense(x, dq)))
    >>> mod = fgr.fold(mod, policy="keep-qdq-weights", ledger=True).mod
    >>> [row.brief() for row in fgr.ledger(tvm.ir.load_json(tvm.ir.save_json(mod)))]
    ['sha256:bef79c0aacebb5cf: kept int8[4, 4] -> int8[4, 4] [keep-dequantize-of-integer-constant]']
    """
    return read_ledger(mod)
