"""The command line: ``fold-guard {inspect,fold,draw,offload,policies,demo}`` and their options.

This module imports nothing but the standard library, so that ``fold-guard --help`` and
``--version`` answer without importing fold_guard (whose import loads TVM): the console script's
launcher (``_fold_guard_cli``) loads this file on its own. Besides the *form* of each argument
(a finite tolerance, a byte size, a known category), :func:`check_arguments` checks what can be
told without TVM before it is imported, so that a typo answers at once (exit 2): the model file
exists and has a known suffix, each policy is a built-in one (unless a ``--plugin`` may register
more), each output path has a known suffix and a directory to go in. What needs the library (a
plugin's policies, the model's content, whether a directory takes a new file) is checked when
the command runs.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import re
import sys
from typing import Iterable, NoReturn, Optional

__all__ = [
    "ANNOTATE_POLICY",
    "BUILTIN_POLICY_NAMES",
    "DECISION_FILTERS",
    "DRAW_SUFFIXES",
    "IR_CHOICES",
    "MODEL_SUFFIXES",
    "MODULE_SUFFIXES",
    "FoldGuardArgumentParser",
    "build_parser",
    "check_arguments",
    "closest",
    "parse_size",
]

IR_CHOICES = ("relax", "relay")
#: Model file suffix -> format name.
MODEL_SUFFIXES = {
    ".onnx": "onnx",
    ".json": "json",
    ".py": "tvmscript",
    ".tflite": "tflite",
    ".pt2": "exported_program",
}
#: What ``fold -o OUT`` writes, by suffix: TVM JSON or TVMScript.
MODULE_SUFFIXES = (".json", ".py")
#: What ``draw -o OUT`` writes, by suffix.
DRAW_SUFFIXES = (".html", ".svg", ".json")
#: The policies fold_guard registers itself (``fold_guard._core.builtin_policies``; a test keeps
#: the two lists equal): what ``-p`` may name before a ``--plugin`` registers more.
BUILTIN_POLICY_NAMES = (
    "default",
    "fold-qnn",
    "keep-low-precision-weights",
    "keep-qdq-weights",
    "keep-requantize",
    "qdq-accelerator",
    "size-guard",
    "weights-only",
)
#: ``fold --annotate``'s policy without ``-p``: ``annotate()``'s default (a test keeps them
#: equal), since annotating under ``default`` places nothing.
ANNOTATE_POLICY = "qdq-accelerator"
#: What ``--only`` selects: the three groups of the headline, then the drawing's finer categories.
DECISION_FILTERS = (
    "folded",
    "kept",
    "not-constant",
    "kept-by-barrier",
    "kept-by-rule",
    "kept-with-input",
    "unsupported",
)

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)

_EPILOG = """\
MODEL is an ONNX file (.onnx; weights become constants, external data is read from beside the
model), a TVM JSON file (.json, from tvm.ir.save_json), TVMScript text (.py: parsed, never run),
a TFLite flatbuffer (.tflite; needs the tflite package) or a saved PyTorch ExportedProgram (.pt2,
from torch.export.save; needs torch, and --trust-model: torch unpickles it). Nothing in MODEL is
executed unless --trust-model is given.
Exit status: 0 success, 1 `fold --check` found different outputs, 2 bad input (file, format,
policy, option, output path; one line on stderr, nothing written), 3 an internal error (rerun
with --debug for the traceback), 4 `fold --check` could not build the unfolded module (the
folded one is written all the same; TVM's limit, not the fold's).
"""


class FoldGuardArgumentParser(argparse.ArgumentParser):
    """argparse, with a usage error as one stderr line (exit 2), like every other bad input."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def closest(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'a' or 'b'?)`` for the nearest ``choices``, or an empty string.

    >>> closest("keep-qdq-weight", ["default", "keep-qdq-weights", "size-guard"])
    " (did you mean 'keep-qdq-weights'?)"
    """
    matches = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.5)
    if not matches:
        return ""
    return " (did you mean " + " or ".join(repr(match) for match in matches) + "?)"


def unknown_policy(name: str, registered: Iterable[str]) -> str:
    """The one line for a ``-p`` name that no policy has (here and once plugins are loaded)."""
    return (
        f"--policy {name}: unknown policy{closest(name, registered)}; "
        "`fold-guard policies` lists them (a backend's policies need --plugin MODULE)"
    )


def model_problem(path: str) -> Optional[str]:
    """What is wrong with MODEL that shows without reading it, or None."""
    if not os.path.exists(path):
        return f"{path}: no such file"
    if os.path.isdir(path):
        return f"{path}: is a directory, not a model file"
    if os.path.splitext(path)[1].lower() not in MODEL_SUFFIXES:
        return (
            f"{path}: unknown model format; expected .onnx, .json (tvm.ir.save_json), "
            ".py (TVMScript), .tflite or .pt2 (torch.export.save)"
        )
    return None


def output_problem(option: str, path: str, suffixes: Iterable[str]) -> Optional[str]:
    """What is wrong with an output path that shows without writing, or None."""
    suffixes = tuple(suffixes)
    if os.path.isdir(path):
        return f"{option} {path}: is a directory"
    if os.path.splitext(path)[1].lower() not in suffixes:
        return f"{option} {path}: unknown output format; use {' or '.join(suffixes)}"
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        return f"{option} {path}: directory {directory} does not exist"
    return None


def check_arguments(args: argparse.Namespace) -> Optional[str]:
    """The first problem with ``args`` that shows before TVM is imported, as one line, or None.

    The command checks the same again once it runs (and more: a plugin's policies, whether a
    directory takes a file); these are the checks a typo meets, answered in the time Python
    takes to start. Under ``--debug`` they are left to the command, which shows a traceback.
    """
    command = args.command
    if command not in ("inspect", "fold", "draw") or args.debug:
        return None  # --debug: the command's own check raises, traceback and all
    problem = model_problem(args.model)
    if problem is None and not args.plugin:
        for name in args.policy or []:
            if name not in BUILTIN_POLICY_NAMES:
                problem = unknown_policy(name, BUILTIN_POLICY_NAMES)
                break
    if problem is None and command == "fold":
        problem = output_problem("-o", args.output, MODULE_SUFFIXES)
        if problem is None and args.report:
            problem = output_problem("--report", args.report, (".json",))
        if problem is None and args.inputs is not None:
            problem = _inputs_problem(args)
    if problem is None and command == "draw":
        problem = output_problem("-o", args.output, DRAW_SUFFIXES)
    return problem


def _inputs_problem(args: argparse.Namespace) -> Optional[str]:
    if not args.check:
        return "--inputs: the inputs are for --check; add --check"
    if os.path.splitext(args.inputs)[1].lower() != ".npz":
        return f"--inputs {args.inputs}: expected a NumPy .npz file (numpy.savez)"
    if not os.path.isfile(args.inputs):
        return f"--inputs {args.inputs}: no such file"
    return None


def parse_size(text: str) -> int:
    """A byte count from ``text``: ``4096``, ``64MiB``, ``1.5 GiB``, ``100kB`` (units: B, kB,
    MB, GB, TB in powers of 1000; KiB, MiB, GiB, TiB in powers of 1024; any case).

    >>> parse_size("64MiB"), parse_size("1.5kib"), parse_size("100 kB"), parse_size("0")
    (67108864, 1536, 100000, 0)
    """
    match = _SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"not a byte size: {text!r} (write e.g. 4096, 64MiB, 1.5GiB or 100kB; "
            "KiB/MiB/GiB are powers of 1024, kB/MB/GB of 1000)"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def _size_argument(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _common() -> FoldGuardArgumentParser:
    common = FoldGuardArgumentParser(add_help=False)
    common.add_argument(
        "--plugin",
        action="append",
        metavar="MODULE|FILE.py",
        default=[],
        help="import a module (found on sys.path or in the current directory) or run a Python "
        "file first, so that the policies it registers can be named (repeatable)",
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
    parser.add_argument(
        "model", metavar="MODEL", help="the model file (.onnx, .json, .py, .tflite or .pt2)"
    )
    parser.add_argument(
        "-p",
        "--policy",
        action="append",
        metavar="P",
        help=policy_help + " (repeatable: policies compose in order; default: default)",
    )
    parser.add_argument(
        "--max-fold-bytes",
        type=_size_argument,
        metavar="SIZE",
        help="keep every fold whose results would take more than SIZE (4096, 64MiB, 1.5GiB)",
    )
    parser.add_argument(
        "--ir",
        choices=IR_CHOICES,
        default="relax",
        help="the IR to import the model into and to fold (default: relax; relay needs a TVM "
        "with Relay and reads .onnx, .json)",
    )
    parser.add_argument(
        "--fq2i", action="store_true", help="Relay: run FakeQuantizationToInteger after the import"
    )
    parser.add_argument(
        "--weights-as-params",
        action="store_true",
        help="Relax, .onnx: import the weights as parameters of main (from_onnx(..., "
        "keep_params_in_input=True)), as large-model flows do; the report then says what "
        "LiftTransformParams lifts and what stays (inspect and draw only)",
    )
    parser.add_argument(
        "--trust-model",
        action="store_true",
        help="allow what can run code from MODEL: a .py that is not TVMScript text is run as a "
        "Python program (its one IRModule is used); a .pt2 is unpickled by torch.export.load. "
        "Only for files you trust",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="list every decision, not only the summary"
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=DECISION_FILTERS,
        metavar="WHAT",
        help="with --verbose (implied), list only these decisions: "
        + ", ".join(DECISION_FILTERS)
        + " (repeatable; kept = kept although its inputs are constant)",
    )


def _backend_options(parser: argparse.ArgumentParser, what: str, *, required: bool = False) -> None:
    table = parser.add_mutually_exclusive_group(required=required)
    table.add_argument(
        "--backend",
        metavar="NAME",
        help=f"{what}: a pattern table TVM's registry knows (Relax: nnapi, clml, cublas, cutlass, "
        "example_npu, or a prefix of registered pattern names; Relay: cmsis-nn, "
        "arm_compute_lib, ethos-n, dnnl)",
    )
    table.add_argument(
        "--patterns",
        metavar="MODULE:ATTRIBUTE",
        help=f"{what}: your own table, the list (or a function returning it) as FuseOpsByPattern "
        "/ MergeComposite take it; imported only with --trust-model",
    )


def build_parser(version: Optional[str] = None) -> argparse.ArgumentParser:
    """The parser of ``fold-guard``; every subcommand has ``--help``.

    ``version`` is what ``--version`` prints (fold_guard's ``__version__``; the launcher passes
    it so that this module needs no import of the package).
    """
    if version is None:
        from .._version import __version__ as version
    common = _common()
    parser = FoldGuardArgumentParser(
        prog="fold-guard",
        description="Inspect, fold, explain and draw fold_guard's constant-folding plan of a model file.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fold-guard {version}")
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
        description="Fold MODEL under the policy and write the result. All outputs are written "
        "together once every step succeeded, or none is.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _model_options(
        fold,
        policy_help="the policy to fold with; with --annotate, to annotate for (there without "
        f"-p: {ANNOTATE_POLICY}, annotate()'s default)",
    )
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
        help="build the module before and after on the CPU, run both on the same inputs "
        "(--inputs, else seeded random ones: integers that index a table, as token ids do, are "
        "drawn in [0, rows)), exit 1 (writing nothing) if their outputs differ; exit 4 (writing "
        "the fold) if TVM cannot build the unfolded module",
    )
    fold.add_argument(
        "--inputs",
        metavar="INPUTS.npz",
        help="--check: the inputs by name (numpy.savez(path, input_ids=...)); any input left "
        "out is drawn at random",
    )
    fold.add_argument(
        "--ledger",
        action="store_true",
        help="also write the precision ledger into the module (one row per weight: layer, dtype "
        "and bytes before and after, folded / kept / lifted, the rule); `inspect OUT.json` prints it",
    )
    fold.add_argument("--seed", type=int, default=0, help="seed of the --check inputs (default: 0)")
    fold.add_argument(
        "--atol",
        type=_tolerance,
        default=1e-5,
        help="--check tolerance, finite and >= 0 (default: 1e-5)",
    )
    fold.add_argument("--report", metavar="REPORT.json", help="also write the JSON report there")

    draw = sub.add_parser(
        "draw",
        parents=[common],
        help="draw the plan as a dataflow graph (.html, .svg) or Model Explorer node data (.json)",
        description="Draw every call of MODEL coloured by its decision; the file opens offline. "
        "The HTML page collapses chains of run-time calls, and has search, zoom, pan, a filter "
        "by decision and details on click.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _model_options(draw, policy_help="the policy to plan with")
    draw.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT",
        help="plan.html or plan.svg, or decisions.json: Model Explorer node data (.onnx models)",
    )
    _backend_options(draw, "colour every call a table could take by its offload")
    draw.add_argument(
        "--numeric",
        action="store_true",
        help="node data: the bytes each node's folds add (+) or save (-), not the decisions",
    )

    offload = sub.add_parser(
        "offload",
        parents=[common],
        help="what a backend's pattern table offloads under each fold, and why not the rest",
        description="Try a backend's pattern table on MODEL after stock FoldConstant, under every "
        "built-in policy and under backend_policy (the fold the table itself asks for), then "
        "list every call under backend_policy: the composite that took it, or why none did. "
        "Matching needs no device.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    offload.add_argument(
        "model", metavar="MODEL", help="the model file (.onnx, .json, .py, .tflite or .pt2)"
    )
    offload.add_argument("--ir", choices=IR_CHOICES, default="relax", help="as for inspect")
    offload.add_argument(
        "--fq2i", action="store_true", help="Relay: run FakeQuantizationToInteger after the import"
    )
    offload.add_argument(
        "--trust-model",
        action="store_true",
        help="allow what runs code: a .py or .pt2 MODEL (as for inspect), --patterns",
    )
    _backend_options(offload, "the table", required=True)
    offload.add_argument(
        "--json",
        action="store_true",
        help="print it as JSON (schema fold-guard-offload, version 1: offload.schema.json)",
    )
    offload.set_defaults(weights_as_params=False)

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
