"""What each subcommand does, in terms of the library: load, fold / annotate / plan, report, write.

No policy logic lives here: policies are resolved by the registry, decisions come from the
adapters' ``fold`` / ``annotate``, and the report from :mod:`fold_guard._core.summary`. Every
output is claimed before the work starts and written only once all of it succeeded
(:class:`._output.Outputs`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence, TextIO, Union

from .. import __version__
from .._core.policy import FoldPolicy
from .._core.registry import list_policies, with_budget
from .._core.summary import format_decision, format_summary
from . import _check
from ._categories import category_of, selected
from ._errors import EXIT_CHECK_FAILED, EXIT_OK, EXIT_UNFOLDED_UNBUILDABLE, CliError
from ._load import LoadedModel, load_model
from ._offload import (
    OFFLOAD_COLOURS,
    backend_report,
    cmd_offload,
    load_table,
    offload_node_data,
    offload_overlay,
)
from ._output import MODULE_SUFFIXES, Outputs, module_text
from ._parser import ANNOTATE_POLICY, unknown_policy
from ._progress import Progress

__all__ = ["run_command"]

PolicySpec = Union[str, List[str], FoldPolicy]


def load_plugins(plugins: Sequence[str]) -> None:
    """Import each ``--plugin`` (a module name, or a ``.py`` file), which registers its policies.

    A module name is looked up on ``sys.path`` and then in the current directory (the console
    script's ``sys.path`` does not hold it). Whatever the plugin raises while it is imported is
    its author's error, not fold_guard's: one line, exit 2.
    """
    for plugin in plugins:
        try:
            if plugin.endswith(".py") or os.sep in plugin:
                _run_plugin_file(plugin)
            else:
                _import_plugin_module(plugin)
        except CliError:
            raise
        except Exception as err:  # any failure of the plugin's own code
            raise CliError(
                f"--plugin {plugin}: importing it failed: {type(err).__name__}: {err}"
            ) from err


def _import_plugin_module(name: str) -> None:
    cwd = os.getcwd()
    if cwd not in sys.path:
        # Last, so a file in the current directory never shadows an installed module.
        sys.path.append(cwd)
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise CliError(
            f"--plugin {name}: no module named {name!r} on the Python path or in {cwd}; "
            "give a file as --plugin path/to/plugin.py"
        )
    importlib.import_module(name)


def _run_plugin_file(path: str) -> None:
    if not os.path.isfile(path):
        raise CliError(f"--plugin {path}: no such file")
    name = "fold_guard_plugin_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CliError(f"--plugin {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    # Registered first, as an import would: a plugin's dataclasses and pickling look it up.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def policy_spec(
    names: Optional[Sequence[str]],
    max_fold_bytes: Optional[int] = None,
    *,
    default: str = "default",
) -> PolicySpec:
    """The ``--policy`` names as the library takes them, each checked against the registry."""
    names = list(names or [default])
    registered = [policy.name for policy in list_policies()]
    for name in names:
        if name not in registered:
            raise CliError(unknown_policy(name, registered))
    spec: PolicySpec = names[0] if len(names) == 1 else names
    if max_fold_bytes is not None:
        spec = with_budget(spec, max_fold_bytes)
    return spec


def _adapter(ir: str) -> Any:
    # Imported on demand: fold_guard.relay exists only with a Relay TVM (checked when loading).
    return importlib.import_module(f"fold_guard.{ir}")


def _load(args: argparse.Namespace, progress: Progress) -> LoadedModel:
    progress.step(f"importing {os.path.basename(args.model)}")
    return load_model(
        args.model,
        ir=args.ir,
        fq2i=args.fq2i,
        trust_model=args.trust_model,
        weights_as_params=args.weights_as_params,
    )


def _fold(model: LoadedModel, spec: PolicySpec, progress: Progress, ledger: bool = False) -> Any:
    progress.step("planning and folding")
    return _adapter(model.ir).fold(model.mod, policy=spec, strict=False, ledger=ledger)


def _with_layers(model: LoadedModel, mod: Any) -> Any:
    """``mod`` with its ledger rows' source layers named from the model file (ONNX nodes)."""
    from .._tvm.ledger_attr import name_module_layers

    return name_module_layers(mod, model.layers)


def _ledger_lines(model: LoadedModel) -> List[str]:
    """The precision ledger the loaded module holds (a module ``fold --ledger`` wrote), if any."""
    rows = _adapter(model.ir).ledger(model.mod)
    if not rows:
        return []
    # binding order (lv2 before lv12), not the rows' key order
    rows.sort(
        key=lambda row: (
            row.function,
            [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", row.label)],
        )
    )
    return [f"ledger in the module: {len(rows)} weights"] + ["  " + row.line() for row in rows]


def _report(model: LoadedModel, result: Any) -> Dict[str, Any]:
    report = result.report.to_dict(layers=model.layers)
    for record in report["decisions"]:
        record["source"] = model.sources.get((record["function"], record["label"]))
    report["model"] = {"path": model.path, "format": model.format, "ir": model.ir}
    report["tool"] = {"name": "fold-guard", "version": __version__}
    return report


def _emit(out: TextIO, text: str) -> None:
    out.write(text if text.endswith("\n") else text + "\n")


def _text(result: Any, report: Dict[str, Any], args: argparse.Namespace) -> str:
    """The grouped summary; with ``-v`` every decision, or those ``--only`` selects."""
    lines = [format_summary(result.plan, report)]
    if args.verbose or args.only:
        wanted = selected(args.only) if args.only else None
        shown = [
            format_decision(node, decision, _layer_text(record))
            for node, decision, record in zip(
                result.plan.graph.nodes, result.plan.decisions, report["decisions"]
            )
            if wanted is None or category_of(decision.reason) in wanted
        ]
        which = f" ({', '.join(args.only)}: {len(shown)})" if args.only else ""
        lines.append(f"decisions{which}:")
        lines.extend("  " + line for line in shown)
    return "\n".join(lines)


def _layer_text(record: Dict[str, Any]) -> Optional[str]:
    """``conv0``, or ``conv0: conv0.weight_DequantizeLinear`` where the node is not the layer."""
    layer, source = record["layer"], record.get("source")
    return f"{layer}: {source}" if layer and source and source != layer else layer


def cmd_inspect(args: argparse.Namespace, out: TextIO) -> int:
    spec = policy_spec(args.policy, args.max_fold_bytes)
    with Progress(["import", "fold"], quiet=args.quiet) as progress:
        model = _load(args, progress)
        result = _fold(model, spec, progress)
    report = _report(model, result)
    rows = _adapter(model.ir).ledger(model.mod)
    if rows:
        report["ledger"] = [row.to_dict() for row in rows]
    if args.json:
        # One line: indent switches json to its slow pure-Python encoder.
        _emit(out, json.dumps(report))
    else:
        _emit(out, f"{model.path} ({model.format}, {model.ir})")
        _emit(out, _text(result, report, args))
        for line in _ledger_lines(model):
            _emit(out, line)
    return EXIT_OK


def cmd_fold(args: argparse.Namespace, out: TextIO) -> int:
    # --annotate without -p annotates for annotate()'s own default: under "default" it would
    # place nothing
    default = ANNOTATE_POLICY if args.annotate else "default"
    spec = policy_spec(args.policy, args.max_fold_bytes, default=default)
    if args.weights_as_params:
        raise CliError(
            "--weights-as-params is for inspect and draw: a written module would lose its "
            "weights; import with weights as parameters in Python (fold_guard.relax.annotate, "
            "then relax.transform.LiftTransformParams) to build one"
        )
    # Refuse a bad output before the (slow) work; write nothing until everything succeeded.
    outputs = Outputs()
    outputs.claim("-o", args.output, MODULE_SUFFIXES)
    if args.report:
        outputs.claim("--report", args.report, (".json",))
    if args.output.lower().endswith(".py") and args.ir != "relax":
        raise CliError(
            f"-o {args.output}: TVMScript output is for Relax modules; write a Relay module as .json"
        )
    steps = (
        ["import", "fold"]
        + (["annotate"] if args.annotate else [])
        + (["check"] if args.check else [])
    )
    annotated = check = None
    unbuildable = ""
    with Progress(steps, quiet=args.quiet) as progress:
        model = _load(args, progress)
        result = _fold(model, spec, progress, ledger=args.ledger and not args.annotate)
        written = result.mod
        if args.annotate:
            progress.step("annotating")
            annotated = _adapter(model.ir).annotate(model.mod, policy=spec, ledger=args.ledger)
            written = annotated.mod
        if args.ledger:
            written = _with_layers(model, written)
        texts = {"-o": module_text(written, args.output, model.ir)}
        if args.check:
            progress.step("compiling and running before/after")
            try:
                check = _run_check(model, written, args.seed, args.atol, args.inputs)
            except _check.UnfoldedUnbuildable as err:
                unbuildable = str(err)
    report = _report(model, result)
    if annotated is not None:
        report["annotations"] = {
            "policy": annotated.policy_name,
            "fold_allow": len(annotated.allows),
            "fold_barrier": len(annotated.barriers),
        }
    if check is not None or unbuildable:
        report["check"] = {
            "ok": check.ok if check is not None else None,
            "max_abs_diff": check.max_abs_diff if check is not None else None,
            "atol": args.atol,
            "seed": args.seed,
            "inputs": args.inputs,
        }
        if unbuildable:
            report["check"]["unbuildable"] = unbuildable
        if check is not None and not check.ok:
            print(f"fold-guard: {args.model}: {check}; nothing was written", file=sys.stderr)
            return EXIT_CHECK_FAILED
    if args.report:
        texts["--report"] = json.dumps(report) + "\n"
    outputs.commit(texts)
    if not args.quiet:
        what = "annotated" if annotated is not None else "folded"
        also = f" and the report to {args.report}" if args.report else ""
        _emit(out, f"wrote the {what} module to {args.output}{also}")
        if args.ledger:
            rows = _adapter(model.ir).ledger(written)
            _emit(
                out, f"with its precision ledger: {len(rows)} weights (fold-guard inspect shows it)"
            )
        if annotated is not None:
            _emit(out, annotated.explain().splitlines()[0])
        _emit(out, _text(result, report, args))
        if check is not None:
            _emit(out, str(check))
    if unbuildable:
        what = "annotated" if annotated is not None else "folded"
        print(
            f"fold-guard: {args.model}: --check: TVM cannot build the unfolded module "
            f"({unbuildable}), so there is nothing to compare with; the {what} module was "
            f"written unchecked to {args.output}",
            file=sys.stderr,
        )
        return EXIT_UNFOLDED_UNBUILDABLE
    return EXIT_OK


def _run_check(
    model: LoadedModel, after: Any, seed: int, atol: float, inputs_path: Optional[str] = None
) -> _check.CheckResult:
    if model.ir == "relay":
        signature, run = _check.relay_signature(model.mod), _check.run_relay
    else:
        signature, run = _check.relax_signature(model.mod), _check.run_relax
    given = _check.load_inputs(inputs_path, signature) if inputs_path else None
    bounds = _check.index_bounds(model.mod, model.ir)
    inputs = _check.random_inputs(signature, seed, bounds, given)
    try:
        before = run(model.mod, inputs)
    except Exception as err:  # TVM's build or run of the module as loaded: not the fold's
        raise _check.UnfoldedUnbuildable(
            f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
        ) from err
    return _check.compare_outputs(before, run(after, inputs), atol)


def cmd_draw(args: argparse.Namespace, out: TextIO) -> int:
    from ._draw import render_svg
    from ._page import render_html

    spec = policy_spec(args.policy, args.max_fold_bytes)
    outputs = Outputs()
    outputs.claim("-o", args.output, (".html", ".svg", ".json"))
    suffix = os.path.splitext(args.output)[1].lower()
    if args.numeric and suffix != ".json":
        raise CliError(f"--numeric is for Model Explorer node data (-o OUT.json), not {suffix}")
    if suffix == ".json":
        _require_explorer_graph(args.model)
    table = load_table(args)[0] if args.backend or args.patterns else None
    if table is not None and args.numeric:
        raise CliError("--numeric shows bytes, --backend offloads: draw one of them at a time")
    with Progress(["import", "fold", "draw"], quiet=args.quiet) as progress:
        model = _load(args, progress)
        result = _fold(model, spec, progress)
        progress.step("drawing")
        title = f"fold-guard plan of {os.path.basename(model.path)}"
        report = _report(model, result)
        offload = None if table is None else backend_report(model, table)
        overlay = {} if offload is None else offload_overlay(offload, _node_ids(result.plan))
        legend = list(OFFLOAD_COLOURS.values()) if offload is not None else []
        if suffix == ".json":
            text = _node_data_text(model, result, args, offload)
        elif suffix == ".svg":
            text = render_svg(
                result.plan, report, title=title, overlay=overlay, overlay_legend=legend
            )
        else:
            text = render_html(
                result.plan, report, title=title, overlay=overlay, overlay_legend=legend
            )
    outputs.commit({"-o": text})
    if not args.quiet:
        _emit(out, f"wrote {len(result.plan.decisions)} calls to {args.output}")
    return EXIT_OK


def _require_explorer_graph(path: str) -> None:
    """Refuse, before any work, a model Model Explorer node data cannot be written for."""
    fmt = os.path.splitext(path)[1].lower()
    if fmt in (".json", ".py"):
        raise CliError(
            f"-o OUT.json writes Model Explorer node data, and {path} is a TVM module: it has no "
            "Model Explorer graph; draw it as -o plan.html or plan.svg"
        )
    if fmt not in (".onnx", ".tflite"):
        raise CliError(
            f"-o OUT.json: Model Explorer node data is written for .onnx and .tflite models, not "
            f"{fmt} (fold_guard does not map its calls to Model Explorer's node ids); "
            "draw it as -o plan.html or plan.svg"
        )


def _node_ids(plan: Any) -> Dict[Any, int]:
    return {(node.function, node.label): node.id for node in plan.graph.nodes}


def _node_data_text(
    model: LoadedModel, result: Any, args: argparse.Namespace, offload: Any = None
) -> str:
    from ._node_data import node_data

    if model.explorer is None:
        raise CliError(
            f"{model.path}: Model Explorer node data needs the Relax import (--ir relax)"
        )
    data = node_data(result.plan, model.explorer, numeric=args.numeric)
    if offload is not None:  # draw --backend: a call a table could take shows its offload
        graph = data.get(model.explorer.graph_id, data) if model.explorer.graph_id else data
        graph["results"].update(offload_node_data(offload, model.explorer.calls))
    return json.dumps(data, indent=1) + "\n"


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
    "offload": cmd_offload,
    "policies": cmd_policies,
    "demo": cmd_demo,
}


def run_command(args: argparse.Namespace, out: TextIO) -> int:
    load_plugins(args.plugin or [])
    return COMMANDS[args.command](args, out)
