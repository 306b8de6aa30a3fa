"""What each subcommand does, in terms of the library: load, fold / annotate / plan, report, write.

No policy logic lives here: policies are resolved by the registry, decisions come from the
adapters' ``fold`` / ``annotate`` / ``plan``, and the report from :mod:`fold_guard._core.summary`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence, TextIO, Union

from .. import __version__
from .._core.errors import FoldGuardError
from .._core.policy import list_policies
from .._core.summary import format_summary
from . import _check
from ._errors import EXIT_CHECK_FAILED, EXIT_OK, CliError, closest
from ._load import LoadedModel, load_model
from ._output import MODULE_SUFFIXES, check_writable, module_text, write_atomically, write_json
from ._progress import Progress

__all__ = ["run_command"]

PolicyNames = Union[str, List[str]]


def load_plugins(modules: Sequence[str]) -> None:
    """Import each ``--plugin`` module, which registers its policies when imported."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise CliError(f"--plugin {name}: cannot import it: {err}") from err
        except FoldGuardError as err:
            raise CliError(f"--plugin {name}: {err}") from err


def policy_spec(names: Optional[Sequence[str]]) -> PolicyNames:
    """The ``--policy`` names as the library takes them, each checked against the registry."""
    names = list(names or ["default"])
    registered = [policy.name for policy in list_policies()]
    for name in names:
        if name not in registered:
            raise CliError(
                f"--policy {name}: unknown policy{closest(name, registered)}; "
                "`fold-guard policies` lists them (a backend's policies need --plugin MODULE)"
            )
    return names[0] if len(names) == 1 else names


def _adapter(ir: str) -> Any:
    # Imported on demand: fold_guard.relay exists only with a Relay TVM (checked when loading).
    return importlib.import_module(f"fold_guard.{ir}")


def _load(args: argparse.Namespace, progress: Progress) -> LoadedModel:
    progress.step(f"importing {os.path.basename(args.model)}")
    return load_model(args.model, ir=args.ir, fq2i=args.fq2i)


def _fold(model: LoadedModel, spec: PolicyNames, progress: Progress) -> Any:
    progress.step("planning and folding")
    return _adapter(model.ir).fold(model.mod, policy=spec, strict=False)


def _report(model: LoadedModel, result: Any) -> Dict[str, Any]:
    report = result.report.to_dict(layers=model.layers)
    report["model"] = {"path": model.path, "format": model.format, "ir": model.ir}
    report["tool"] = {"name": "fold-guard", "version": __version__}
    return report


def _emit(out: TextIO, text: str) -> None:
    out.write(text if text.endswith("\n") else text + "\n")


def cmd_inspect(args: argparse.Namespace, out: TextIO) -> int:
    spec = policy_spec(args.policy)
    with Progress(["import", "fold"], quiet=args.quiet) as progress:
        model = _load(args, progress)
        result = _fold(model, spec, progress)
    report = _report(model, result)
    if args.json:
        _emit(
            out, json.dumps(report)
        )  # one line: indent switches json to its slow pure-Python encoder
    else:
        _emit(out, f"{model.path} ({model.format}, {model.ir})")
        _emit(out, format_summary(result.plan, report, verbose=args.verbose))
    return EXIT_OK


def cmd_fold(args: argparse.Namespace, out: TextIO) -> int:
    spec = policy_spec(args.policy)
    # Refuse a bad OUT before the (slow) work, and write nothing until everything succeeded.
    check_writable(args.output, "-o")
    if os.path.splitext(args.output)[1].lower() not in MODULE_SUFFIXES:
        raise CliError(
            f"-o {args.output}: unknown output format; use .json (tvm.ir.save_json) or .py (TVMScript)"
        )
    if args.report:
        check_writable(args.report, "--report")
    steps = (
        ["import", "fold"]
        + (["annotate"] if args.annotate else [])
        + (["check"] if args.check else [])
    )
    with Progress(steps, quiet=args.quiet) as progress:
        model = _load(args, progress)
        result = _fold(model, spec, progress)
        written = result.mod
        if args.annotate:
            progress.step("annotating")
            annotated = _annotate(model, spec)
            written = annotated.mod
        text = module_text(written, args.output, model.ir)
        check = None
        if args.check:
            progress.step("compiling and running before/after")
            check = _run_check(model, written, args.seed, args.atol)
    report = _report(model, result)
    if args.annotate:
        report["annotations"] = {
            "fold_allow": len(annotated.allows),
            "fold_barrier": len(annotated.barriers),
        }
    if check is not None:
        report["check"] = {
            "ok": check.ok,
            "max_abs_diff": check.max_abs_diff,
            "atol": check.atol,
            "seed": args.seed,
        }
    if check is not None and not check.ok:
        print(
            f"fold-guard: {args.model}: {check}; nothing written to {args.output}", file=sys.stderr
        )
        return EXIT_CHECK_FAILED
    write_atomically(args.output, text, "-o")
    if args.report:
        write_json(args.report, report, "--report")
    if not args.quiet:
        what = "annotated" if args.annotate else "folded"
        _emit(out, f"wrote the {what} module to {args.output}")
        if args.annotate:
            _emit(out, annotated.explain().splitlines()[0])
        _emit(out, format_summary(result.plan, report, verbose=args.verbose))
        if check is not None:
            _emit(out, str(check))
    return EXIT_OK


def _annotate(model: LoadedModel, spec: PolicyNames) -> Any:
    return _adapter(model.ir).annotate(model.mod, policy=spec)


def _run_check(model: LoadedModel, after: Any, seed: int, atol: float) -> _check.CheckResult:
    if model.ir == "relay":
        signature, run = _check.relay_signature(model.mod), _check.run_relay
    else:
        signature, run = _check.relax_signature(model.mod), _check.run_relax
    inputs = _check.random_inputs(signature, seed)
    return _check.compare_outputs(run(model.mod, inputs), run(after, inputs), atol)


def cmd_draw(args: argparse.Namespace, out: TextIO) -> int:
    from ._draw import render_html, render_svg

    spec = policy_spec(args.policy)
    suffix = os.path.splitext(args.output)[1].lower()
    check_writable(args.output, "-o")
    if suffix not in (".html", ".svg"):
        raise CliError(f"-o {args.output}: draw writes .html or .svg")
    with Progress(["import", "fold", "draw"], quiet=args.quiet) as progress:
        model = _load(args, progress)
        result = _fold(model, spec, progress)
        progress.step("drawing")
        title = f"fold-guard plan of {os.path.basename(model.path)}"
        if suffix == ".svg":
            text = render_svg(result.plan, model.layers, title=title)
        else:
            text = render_html(result.plan, model.layers, _report(model, result), title=title)
    write_atomically(args.output, text, "-o")
    if not args.quiet:
        _emit(out, f"wrote {len(result.plan.decisions)} calls to {args.output}")
    return EXIT_OK


def cmd_policies(args: argparse.Namespace, out: TextIO) -> int:
    policies = list_policies()
    if args.json:
        data = {
            "schema": "fold-guard-policies",
            "version": 1,
            "policies": [
                {
                    "name": policy.name,
                    "description": policy.description,
                    "rules": [
                        {
                            "name": rule.name,
                            "action": rule.action.value,
                            "description": rule.description,
                        }
                        for rule in policy.rules
                    ],
                }
                for policy in policies
            ],
        }
        _emit(out, json.dumps(data, indent=2))
    else:
        _emit(out, "\n".join(policy.describe() for policy in policies))
    return EXIT_OK


def cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    """Build a small QDQ CNN, then inspect it under two policies, as a user would."""
    try:
        import onnx
    except ImportError as err:
        raise CliError(f"demo: needs onnx ({err}); pip install 'fold-guard[examples]'") from err
    from ._demo import qdq_cnn

    with tempfile.TemporaryDirectory(prefix="fold-guard-demo-") as tmp:
        path = os.path.join(tmp, "qdq_cnn.onnx")
        with Progress(["build"], quiet=args.quiet) as progress:
            progress.step("building a QDQ CNN")
            onnx.save(qdq_cnn(), path)
        model = load_model(path)
        for policy in ("default", "keep-qdq-weights"):
            _emit(out, f"$ fold-guard inspect qdq_cnn.onnx --policy {policy}")
            result = _adapter(model.ir).fold(model.mod, policy=policy)
            _emit(out, format_summary(result.plan, _report(model, result)) + "\n")
    _emit(
        out,
        "Stock folding (default) turns every weight dequantize into an fp32 constant; "
        "keep-qdq-weights keeps them for a QDQ backend to match.",
    )
    return EXIT_OK


COMMANDS = {
    "inspect": cmd_inspect,
    "fold": cmd_fold,
    "draw": cmd_draw,
    "policies": cmd_policies,
    "demo": cmd_demo,
}


def run_command(args: argparse.Namespace, out: TextIO) -> int:
    load_plugins(args.plugin or [])
    return COMMANDS[args.command](args, out)
