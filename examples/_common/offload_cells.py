"""One cell of the offload matrix: a backend table on a model, under every fold flow (either IR).

A cell counts the calls the table offloads (``explain_offload``'s rows: calls of an op some
pattern is built around that read run-time data) under stock ``FoldConstant``, every built-in
policy and ``backend_policy(table)``; under ``backend_policy`` it also lists the dequantize
calls of constants left to run time outside a composite, and the reason of every missed call.
:func:`measure` takes an adapter's ``OffloadSession``-making pieces, so both IRs' scripts
(``examples/offload_matrix.py``, ``examples/relay_offload_matrix.py``) share it.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Sequence, Tuple

from fold_guard import list_policies
from fold_guard._tvm.offload import OffloadAdapter, OffloadSession

__all__ = ["FLOWS", "Cell", "format_cells", "measure"]

#: The flows of a row, in column order: stock, every built-in policy, backend_policy.
FLOWS: Tuple[str, ...] = ("stock", *(p.name for p in list_policies()), "backend")
_SHORT = {
    "stock": "stock",
    "default": "default",
    "fold-qnn": "fold-qnn",
    "keep-low-precision-weights": "keep-lp",
    "keep-qdq-weights": "keep-qdq",
    "keep-requantize": "keep-rq",
    "qdq-accelerator": "qdq-acc",
    "size-guard": "size",
    "weights-only": "w-only",
    "backend": "backend",
}


@dataclass
class Cell:
    """A table on a model: rows (candidate calls), offloaded per flow, what backend_policy left."""

    model: str
    table: str
    rows: int
    counts: Dict[str, int]
    runtime_dequantize: Tuple[str, ...]
    reasons: Dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    examples: List[str] = field(default_factory=list)

    @property
    def best_other(self) -> int:
        return max(n for flow, n in self.counts.items() if flow != "backend")

    @property
    def ok(self) -> bool:
        """backend_policy offloads at least the best other flow, leaves no run-time dequantize
        of a constant outside a composite, and gives every missed call a known reason."""
        return (
            self.counts["backend"] >= self.best_other
            and not self.runtime_dequantize
            and "unknown" not in self.reasons
        )


def measure(
    adapter: OffloadAdapter,
    model: str,
    mod: Any,
    table: Any,
    table_name: str,
    backend_policy: Callable[[Any], Any],
) -> Cell:
    """The cell of ``table`` on ``mod`` (see the module docstring)."""
    start = time.perf_counter()
    session = OffloadSession(adapter, mod, table)
    counts = {"stock": session.count_stock()}
    for policy in list_policies():
        counts[policy.name] = session.count(policy.name)
    policy = backend_policy(table_name)
    counts["backend"] = session.count(policy)
    report = session.report(policy)
    reasons = collections.Counter(
        row.reason.kind if row.reason is not None else "unknown" for row in report.missed
    )
    return Cell(
        model,
        table_name,
        len(report.rows),
        counts,
        session.runtime_dequantize(policy),
        dict(reasons),
        time.perf_counter() - start,
        [f"{row.name} ({row.op}): {row.reason.detail}" for row in report.missed[:2] if row.reason],
    )


def format_cells(cells: Sequence[Cell], *, details: bool = False, header: bool = True) -> str:
    """The matrix as text: a header, one line per cell (offloaded calls per flow)."""
    title = (
        f"{'model':14s} {'table':22s} {'rows':>4s} "
        + " ".join(f"{_SHORT.get(f, f):>8s}" for f in FLOWS)
        + "  ok  missed by reason"
    )
    lines = [title] if header else []
    for cell in cells:
        reasons = ", ".join(f"{kind} {n}" for kind, n in sorted(cell.reasons.items())) or "-"
        left = (
            f"; run-time DQ: {','.join(cell.runtime_dequantize)}" if cell.runtime_dequantize else ""
        )
        lines.append(
            f"{cell.model:14s} {cell.table:22s} {cell.rows:>4d} "
            + " ".join(f"{cell.counts[f]:>8d}" for f in FLOWS)
            + f"  {'yes' if cell.ok else 'NO ':3s} {reasons}{left}"
        )
        if details:
            lines.extend(f"{'':20s}{example}" for example in cell.examples)
    return "\n".join(lines)
