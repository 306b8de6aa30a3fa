"""Why a backend's table did or did not take each call: ``explain_offload``'s report, as data.

One :class:`OffloadRow` per call of an op some pattern of the table is built around (its anchor:
``conv2d``, ``matmul``, ``qnn.conv2d``, ...) that reads run-time data: a call computed from
constants only is not a layer, it is folded or lifted ahead of run time. A row says which
composite took the call, or why none did (:class:`OffloadReason`, ``kind`` one of
:data:`REASON_KINDS`):

* ``operand-not-constant``: a pattern wants an operand as a constant and it is not one (which
  operand, whether a fold would make it constant, which rule or pass kept it);
* ``folded-away``: a pattern wants a call on constants (a weight's dequantize, a decode kernel)
  and it was folded (by which rule);
* ``check-refused``: the structure matches a pattern (as the module is, or once the decisions it
  needs are made) but the pattern's check refused it: the check's name, and the call's operand
  dtypes, shapes and quantization beside it;
* ``no-pattern``: no pattern of the table has this structure (the closest one, and where it
  differs).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

__all__ = [
    "CHECK_REFUSED",
    "FOLDED_AWAY",
    "NO_PATTERN",
    "OPERAND_NOT_CONSTANT",
    "REASON_KINDS",
    "OffloadReason",
    "OffloadReport",
    "OffloadRow",
]

OPERAND_NOT_CONSTANT = "operand-not-constant"
FOLDED_AWAY = "folded-away"
CHECK_REFUSED = "check-refused"
NO_PATTERN = "no-pattern"
#: Every kind a reason can have, in the order ``explain()`` groups them.
REASON_KINDS = (OPERAND_NOT_CONSTANT, FOLDED_AWAY, CHECK_REFUSED, NO_PATTERN)


@dataclass(frozen=True)
class OffloadReason:
    """Why a call was not offloaded: ``kind`` (:data:`REASON_KINDS`), a sentence, the pattern
    the sentence is about (None for ``no-pattern`` without a close one)."""

    kind: str
    detail: str
    pattern: Optional[str] = None

    def to_dict(self) -> Dict[str, object]:
        return {"kind": self.kind, "detail": self.detail, "pattern": self.pattern}


@dataclass(frozen=True)
class OffloadRow:
    """One call: its name (the layer where known, else its binding), op, the composite it is in
    (None when not offloaded) and the reason (None when offloaded)."""

    name: str
    op: str
    composite: Optional[str]
    reason: Optional[OffloadReason]
    function: str = "main"
    label: str = ""

    @property
    def offloaded(self) -> bool:
        return self.composite is not None

    def to_dict(self) -> Dict[str, object]:
        return {
            "name": self.name,
            "op": self.op,
            "composite": self.composite,
            "reason": None if self.reason is None else self.reason.to_dict(),
            "function": self.function,
            "label": self.label,
        }


@dataclass(frozen=True)
class OffloadReport:
    """What ``table`` takes of a module (folded under ``policy``, or as given when None).

    >>> row = OffloadRow("conv0", "qnn.conv2d", None, OffloadReason("check-refused", "its check refused it"))
    >>> taken = OffloadRow("fc", "qnn.dense", "cmsis-nn.qnn_fully_connected", None)
    >>> report = OffloadReport("cmsis-nn", "default", (row, taken))
    >>> print(report.explain())
    cmsis-nn under policy 'default': 1 of 2 calls offloaded
      offloaded (1): cmsis-nn.qnn_fully_connected 1
      check-refused (1):
        conv0 (qnn.conv2d): its check refused it
    """

    table: str
    policy: Optional[str]
    rows: Tuple[OffloadRow, ...]

    @property
    def offloaded(self) -> int:
        return sum(row.offloaded for row in self.rows)

    @property
    def missed(self) -> Tuple[OffloadRow, ...]:
        return tuple(row for row in self.rows if not row.offloaded)

    def counts(self) -> Dict[str, int]:
        """``offloaded`` and each reason kind: how many rows."""
        counts = {"offloaded": self.offloaded}
        counts.update({kind: 0 for kind in REASON_KINDS})
        for row in self.missed:
            if row.reason is not None:
                counts[row.reason.kind] += 1
        return counts

    def explain(self, *, limit: Optional[int] = None) -> str:
        """The rows grouped: offloaded by composite, then every missed call under its reason
        (``limit`` rows per reason at most)."""
        under = f"policy {self.policy!r}" if self.policy else "the module as given"
        lines = [
            f"{self.table} under {under}: {self.offloaded} of {len(self.rows)} calls offloaded"
        ]
        composites = Counter(row.composite for row in self.rows if row.composite)
        if composites:
            listed = ", ".join(f"{name} {n}" for name, n in sorted(composites.items()))
            lines.append(f"  offloaded ({self.offloaded}): {listed}")
        by_kind: Dict[str, List[OffloadRow]] = {}
        for row in self.missed:
            by_kind.setdefault(row.reason.kind if row.reason else "unknown", []).append(row)
        for kind in (*REASON_KINDS, "unknown"):
            rows = by_kind.get(kind, [])
            if not rows:
                continue
            lines.append(f"  {kind} ({len(rows)}):")
            shown = rows if limit is None else rows[:limit]
            for row in shown:
                detail = row.reason.detail if row.reason else ""
                lines.append(f"    {row.name} ({row.op}): {detail}")
            if len(shown) < len(rows):
                lines.append(f"    ... {len(rows) - len(shown)} more")
        return "\n".join(lines)

    def to_dict(self) -> Dict[str, object]:
        return {
            "table": self.table,
            "policy": self.policy,
            "offloaded": self.offloaded,
            "calls": len(self.rows),
            "counts": self.counts(),
            "rows": [row.to_dict() for row in self.rows],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def named(self, layers: Mapping[Tuple[str, str], str]) -> OffloadReport:
        """The same report with each row named after its layer where ``layers`` knows it."""
        rows = tuple(
            OffloadRow(
                layers.get((row.function, row.label), row.name),
                row.op,
                row.composite,
                row.reason,
                row.function,
                row.label,
            )
            for row in self.rows
        )
        return OffloadReport(self.table, self.policy, rows)
