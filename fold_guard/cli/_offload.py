"""``fold-guard offload MODEL --backend NAME`` and ``draw --backend``: what a backend's table takes.

The table is a name TVM's registry knows (``--backend``: Relax ``nnapi``, ``clml``, ``cublas``,
``cutlass``, ``example_npu``; Relay ``cmsis-nn``, ``arm_compute_lib``, ``ethos-n``, ``dnnl``) or a
user's own, ``--patterns module:attribute`` (a list as ``FuseOpsByPattern`` / ``MergeComposite``
takes it, or a function returning one), imported only with ``--trust-model``: it is code.

``offload`` prints how many calls the table takes after stock ``FoldConstant``, under every
built-in policy and under ``backend_policy``, then every call under ``backend_policy``: the
composite that took it, or why none did. ``--json`` writes the same as data (schema
``fold-guard-offload``, version 1: ``offload.schema.json``). ``draw --backend`` colours each
such call by its offload, and Model Explorer node data carries the same values.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any, Dict, Mapping, TextIO, Tuple

from .. import __version__
from .._core.offload_report import REASON_KINDS, OffloadReport
from .._core.registry import list_policies
from ._errors import EXIT_OK, CliError
from ._load import LoadedModel, load_model

__all__ = [
    "OFFLOAD_COLOURS",
    "OFFLOAD_SCHEMA_NAME",
    "OFFLOAD_SCHEMA_PATH",
    "backend_report",
    "cmd_offload",
    "offload_node_data",
    "offload_overlay",
    "offload_report",
]

OFFLOAD_SCHEMA_NAME = "fold-guard-offload"
OFFLOAD_SCHEMA_VERSION = 1
OFFLOAD_SCHEMA_PATH = os.path.join(os.path.dirname(__file__), "offload.schema.json")
#: What ``draw --backend`` colours a call by: offloaded, or the kind of reason it was not (none
#: of the decision colours, ``._categories.CATEGORIES``, so the two never read alike).
OFFLOAD_COLOURS: Dict[str, Tuple[str, str]] = {
    "offloaded": ("offloaded", "#1565c0"),
    "operand-not-constant": ("not offloaded: an operand is not constant", "#f9a825"),
    "folded-away": ("not offloaded: a call it needs was folded away", "#00838f"),
    "check-refused": ("not offloaded: the pattern's check refused", "#ad1457"),
    "no-pattern": ("not offloaded: no pattern has this structure", "#90a4ae"),
}
assert set(OFFLOAD_COLOURS) == {"offloaded", *REASON_KINDS}


def load_table(args: argparse.Namespace) -> Tuple[Any, str]:
    """The table ``--backend`` names or ``--patterns`` imports, and its name for messages."""
    backend, patterns = getattr(args, "backend", None), getattr(args, "patterns", None)
    if backend and patterns:
        raise CliError("give --backend NAME or --patterns MODULE:ATTRIBUTE, not both")
    if backend:
        return backend, backend
    if not patterns:
        raise CliError("name the backend's table: --backend NAME or --patterns MODULE:ATTRIBUTE")
    if not args.trust_model:
        raise CliError(
            f"--patterns {patterns}: importing it runs its code; add --trust-model if you trust it"
        )
    module_name, _, attribute = patterns.partition(":")
    if not module_name or not attribute:
        raise CliError(
            f"--patterns {patterns}: write it as MODULE:ATTRIBUTE (my_npu.patterns:TABLE)"
        )
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)  # last: a file here never shadows an installed module
    try:
        module = importlib.import_module(module_name)
        table = getattr(module, attribute)
    except Exception as err:  # the user's module: any failure of its code is theirs
        raise CliError(f"--patterns {patterns}: {type(err).__name__}: {err}") from err
    if callable(table) and not isinstance(table, (list, tuple)):
        try:
            table = table()
        except Exception as err:
            raise CliError(
                f"--patterns {patterns}: calling it raised {type(err).__name__}: {err}"
            ) from err
    return table, patterns


def offload_report(model: LoadedModel, table: Any) -> Tuple[Dict[str, int], OffloadReport]:
    """Counts per flow (stock, every built-in policy, backend_policy) and the report under
    ``backend_policy``, its rows named after the model's layers."""

    session, backend = _session(model, table)
    counts: Dict[str, int] = {"stock": session.count_stock()}
    for policy in list_policies():
        counts[policy.name] = session.count(policy.name)
    counts[backend.name] = session.count(backend)
    return counts, session.report(backend).named(model.layers)


def backend_report(model: LoadedModel, table: Any) -> OffloadReport:
    """The report under ``backend_policy(table)`` alone (what ``draw --backend`` shows)."""
    session, backend = _session(model, table)
    return session.report(backend).named(model.layers)


def _session(model: LoadedModel, table: Any) -> Tuple[Any, Any]:
    from .._tvm.offload import OffloadSession

    offload = importlib.import_module(f"fold_guard.{model.ir}._offload")
    read = importlib.import_module(f"fold_guard.{model.ir}._offload.table").resolve_table(table)
    return OffloadSession(offload.ADAPTER, model.mod, read), offload.backend_policy(table)


def _text(model: LoadedModel, counts: Mapping[str, int], report: OffloadReport) -> str:
    width = max(len(flow) for flow in counts)
    lines = [
        f"{model.path} ({model.format}, {model.ir}): table {report.table}, {len(report.rows)} calls"
    ]
    lines.append("calls offloaded, by fold:")
    lines += [f"  {flow:{width}s} {n}" for flow, n in counts.items()]
    lines.append(report.explain())
    return "\n".join(lines)


def cmd_offload(args: argparse.Namespace, out: TextIO) -> int:
    from ._progress import Progress

    table, _ = load_table(args)
    with Progress(["import", "offload"], quiet=args.quiet) as progress:
        progress.step(f"importing {os.path.basename(args.model)}")
        model = load_model(args.model, ir=args.ir, fq2i=args.fq2i, trust_model=args.trust_model)
        progress.step("trying the table under each fold")
        counts, report = offload_report(model, table)
    if args.json:
        data = {
            "schema": OFFLOAD_SCHEMA_NAME,
            "version": OFFLOAD_SCHEMA_VERSION,
            "model": {"path": model.path, "format": model.format, "ir": model.ir},
            "tool": {"name": "fold-guard", "version": __version__},
            "table": report.table,
            "counts": dict(counts),
            "report": report.to_dict(),
        }
        out.write(json.dumps(data) + "\n")
    else:
        out.write(_text(model, counts, report) + "\n")
    return EXIT_OK


def offload_overlay(
    report: OffloadReport, labels: Mapping[Tuple[str, str], int]
) -> Dict[int, Tuple[str, str, str]]:
    """Node id -> (fill colour, caption, hover note) of each call of the report."""
    overlay: Dict[int, Tuple[str, str, str]] = {}
    for row in report.rows:
        node = labels.get((row.function, row.label))
        if node is None:
            continue
        if row.composite is not None:
            overlay[node] = (OFFLOAD_COLOURS["offloaded"][1], f"→ {row.composite}", "offloaded")
        elif row.reason is not None:
            note = f"not offloaded: {row.reason.kind}: {row.reason.detail}"
            overlay[node] = (OFFLOAD_COLOURS[row.reason.kind][1], row.reason.kind, note)
    return overlay


def offload_node_data(
    report: OffloadReport, calls: Mapping[Tuple[str, str], str]
) -> Dict[str, Dict[str, str]]:
    """Model Explorer results of each call of the report that has a node (``calls``)."""
    results: Dict[str, Dict[str, str]] = {}
    for row in report.rows:
        node = calls.get((row.function, row.label))
        if node is None:
            continue
        kind = "offloaded" if row.composite is not None else (row.reason.kind if row.reason else "")
        if kind not in OFFLOAD_COLOURS:
            continue
        value = f"offloaded: {row.composite}" if row.composite else f"not offloaded: {kind}"
        results[node] = {
            "value": value,
            "bgColor": OFFLOAD_COLOURS[kind][1],
            "textColor": "#ffffff",
        }
    return results
