"""The precision ledger as an ``IRModule`` attribute, for both adapters.

The rows come from the TVM-free core (:mod:`fold_guard._core.ledger`); here they are written as
the module attribute ``fold_guard.ledger`` (nested maps of strings and integers, which
``tvm.ir.save_json`` / ``load_json`` and the stock passes of both IRs carry unchanged: Relax on
0.27, Relay on 0.16) and read back as plain Python.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import tvm

from .._core.ledger import (
    LEDGER_ATTR,
    LedgerRow,
    ledger_payload,
    ledger_rows_from_payload,
    name_layers,
)

__all__ = ["name_module_layers", "read_ledger", "write_ledger"]


def _payload(mod: tvm.IRModule) -> Optional[Dict[str, Any]]:
    attrs = mod.attrs
    if attrs is None or LEDGER_ATTR not in attrs:
        return None
    value = _plain(attrs[LEDGER_ATTR])
    return value if isinstance(value, dict) else None


def _plain(value: Any) -> Any:
    """A TVM Map / Array / string / integer as plain Python."""
    if isinstance(value, (str, int, float)):
        return value
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "__len__") and hasattr(value, "__getitem__"):
        return [_plain(v) for v in value]
    if hasattr(value, "value"):
        return value.value
    return value


def read_ledger(mod: tvm.IRModule) -> List[LedgerRow]:
    """The rows of ``mod``'s ledger attribute, in key order; empty without one."""
    return ledger_rows_from_payload(_payload(mod))


def write_ledger(mod: tvm.IRModule, rows: Sequence[LedgerRow]) -> tvm.IRModule:
    """``mod`` with ``rows`` added to its ledger attribute (rows already there stay)."""
    present = _payload(mod)
    return mod.with_attr(LEDGER_ATTR, ledger_payload(rows, present))


def name_module_layers(mod: tvm.IRModule, layers: Mapping[Tuple[str, str], str]) -> tvm.IRModule:
    """``mod`` with each ledger row's empty source layer filled from ``layers``."""
    rows = read_ledger(mod)
    if not rows:
        return mod
    return mod.with_attr(LEDGER_ATTR, ledger_payload(name_layers(rows, layers)))
