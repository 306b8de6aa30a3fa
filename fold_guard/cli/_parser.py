"""The command line: ``fold-guard {inspect,fold,draw,policies,demo}`` and their options."""

from __future__ import annotations

import argparse

from .. import __version__
from ._load import IR_CHOICES

__all__ = ["build_parser"]

_EPILOG = """\
MODEL is an ONNX file (.onnx; imported with weights as constants), a TVM JSON file (.json, from
tvm.ir.save_json) or a TVMScript file (.py) holding one IRModule.
Exit status: 0 success, 1 `fold --check` found different outputs, 2 bad input (file, format,
policy, output path), 3 an internal error (rerun with --debug for the traceback).
"""


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--plugin",
        action="append",
        metavar="MODULE",
        default=[],
        help="import MODULE first, so that the policies it registers can be named (repeatable)",
    )
    common.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress bar; fold and draw then print nothing but errors",
    )
    common.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return common


def _model_options(parser: argparse.ArgumentParser, *, policy_help: str) -> None:
    parser.add_argument("model", metavar="MODEL", help="the model file (.onnx, .json or .py)")
    parser.add_argument(
        "-p",
        "--policy",
        action="append",
        metavar="P",
        help=policy_help + " (repeatable: policies compose in order; default: default)",
    )
    parser.add_argument(
        "--ir",
        choices=IR_CHOICES,
        default="relax",
        help="the IR to import ONNX into and to fold (default: relax; relay needs a TVM with Relay)",
    )
    parser.add_argument(
        "--fq2i", action="store_true", help="Relay: run FakeQuantizationToInteger after the import"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="list every decision, not only the summary"
    )


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``fold-guard``; every subcommand has ``--help``."""
    common = _common()
    parser = argparse.ArgumentParser(
        prog="fold-guard",
        description="Inspect, fold, explain and draw fold_guard's constant-folding plan of a model file.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fold-guard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    inspect = sub.add_parser(
        "inspect",
        parents=[common],
        help="print what a policy folds and keeps, and why",
        description="Fold MODEL in memory under the policy and print the grouped report "
        "(counts by decision, reason and op; bytes; largest folds; each rule's calls).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _model_options(inspect, policy_help="the policy to plan with")
    inspect.add_argument(
        "--json",
        action="store_true",
        help="print the report as JSON (schema fold-guard-report, version 1: report.schema.json)",
    )

    fold = sub.add_parser(
        "fold",
        parents=[common],
        help="write the folded (or annotated) module",
        description="Fold MODEL under the policy and write the result; nothing is written on failure.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _model_options(fold, policy_help="the policy to fold with")
    fold.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT",
        help="where to write the module: .json (tvm.ir.save_json) or .py (TVMScript, Relax only)",
    )
    fold.add_argument(
        "--annotate",
        action="store_true",
        help="write the module annotated with fold_barrier / fold_allow (what annotate() returns) "
        "instead of folded, so any later pipeline keeps the policy's decisions",
    )
    fold.add_argument(
        "--check",
        action="store_true",
        help="build the module before and after on the CPU, run both on seeded random inputs, "
        "exit 1 (writing nothing) if their outputs differ",
    )
    fold.add_argument("--seed", type=int, default=0, help="seed of the --check inputs (default: 0)")
    fold.add_argument("--atol", type=float, default=1e-5, help="--check tolerance (default: 1e-5)")
    fold.add_argument("--report", metavar="REPORT.json", help="also write the JSON report there")

    draw = sub.add_parser(
        "draw",
        parents=[common],
        help="draw the plan as a dataflow graph (.html or .svg)",
        description="Draw every call of MODEL coloured by its decision; the file opens offline.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _model_options(draw, policy_help="the policy to plan with")
    draw.add_argument("-o", "--output", required=True, metavar="OUT", help="plan.html or plan.svg")

    policies = sub.add_parser(
        "policies",
        parents=[common],
        help="list the registered policies and their rules",
        description="List the registered policies. A backend's policies appear after "
        "--plugin MODULE, which imports MODULE (it calls register_policy).",
    )
    policies.add_argument(
        "--json", action="store_true", help="as JSON (schema fold-guard-policies, version 1)"
    )

    sub.add_parser(
        "demo",
        parents=[common],
        help="build a small QDQ CNN and inspect it under two policies",
        description="Build a small QDQ-quantized CNN with onnx (fixed seeds, no download) and inspect "
        "it under default and keep-qdq-weights. Needs onnx.",
    )
    return parser
