"""Reading a model file into an IRModule: ONNX, TVM JSON or TVMScript, for Relax or Relay.

Every failure a user can cause (no such file, not readable, not the format its name says, a model
the frontend cannot import, no Relay in this TVM) becomes a :class:`CliError` naming the file.

Relax's ONNX importer names every binding ``lv<N>`` and records no spans, so the ONNX node each
binding came from is recovered here, while importing (:func:`_onnx_layer_names`): that is what
lets the report say ``conv0`` instead of ``lv6``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import runpy
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

from ._errors import CliError

__all__ = ["IR_CHOICES", "LoadedModel", "load_model", "require_relay"]

IR_CHOICES = ("relax", "relay")
_SUFFIXES = {".onnx": "onnx", ".json": "json", ".py": "tvmscript"}


@dataclass(frozen=True)
class LoadedModel:
    """A model file read into ``mod`` of IR ``ir``; ``layers`` maps ``(function, var) -> layer``."""

    path: str
    format: str
    ir: str
    mod: Any
    layers: Mapping[Tuple[str, str], str] = field(default_factory=dict)


def require_relay() -> None:
    """Refuse ``--ir relay`` where the installed TVM has no Relay, saying what to install."""
    if importlib.util.find_spec("tvm") is None or importlib.util.find_spec("tvm.relay") is None:
        import tvm

        raise CliError(
            f"--ir relay: the installed TVM ({tvm.__version__}) has no Relay; use a TVM build "
            "with Relay (0.9 to 0.19, e.g. hhb-tvm==3.2.3 on Python 3.10), or --ir relax"
        )


def require_relax() -> None:
    """Refuse the Relax path where fold_guard.relax cannot run on the installed TVM."""
    from .._core.errors import UnsupportedIRError

    try:
        import fold_guard.relax  # noqa: F401
    except (ImportError, UnsupportedIRError) as err:
        raise CliError(
            f"--ir relax: {' '.join(str(err).split())}; with a Relay TVM pass --ir relay"
        ) from err


def load_model(path: str, *, ir: str = "relax", fq2i: bool = False) -> LoadedModel:
    """Read ``path`` (format by suffix) into a module of ``ir``.

    Parameters
    ----------
    path : str
        An ``.onnx`` model (weights become constants), a ``.json`` file written by
        ``tvm.ir.save_json``, or a ``.py`` TVMScript file holding one IRModule.
    ir : {"relax", "relay"}
        The IR to import an ONNX model into; a JSON or TVMScript module must already be of it.
    fq2i : bool
        Relay only: run ``FakeQuantizationToInteger`` after the import.

    Raises
    ------
    CliError
        Naming ``path`` and what is wrong with it.
    """
    if ir == "relay":
        require_relay()
    else:
        require_relax()
        if fq2i:
            raise CliError("--fq2i: FakeQuantizationToInteger is a Relay pass; add --ir relay")
    if not os.path.exists(path):
        raise CliError(f"{path}: no such file")
    if os.path.isdir(path):
        raise CliError(f"{path}: is a directory, not a model file")
    fmt = _SUFFIXES.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        raise CliError(
            f"{path}: unknown model format; expected .onnx, .json (tvm.ir.save_json) or .py (TVMScript)"
        )
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as err:
        raise CliError(f"{path}: cannot read: {err.strerror}") from err
    if fmt == "onnx":
        mod, layers = _import_onnx(path, data, ir)
    elif fmt == "json":
        mod, layers = _load_json(path, data), {}
    else:
        mod, layers = _load_tvmscript(path, data), {}
    _check_ir(path, mod, ir)
    if fq2i:
        from tvm import relay

        mod = relay.transform.FakeQuantizationToInteger()(relay.transform.InferType()(mod))
    if ir == "relay":
        layers = _relay_layer_names(mod)
    return LoadedModel(path, fmt, ir, mod, layers)


def _relay_layer_names(mod: Any) -> Mapping[Tuple[str, str], str]:
    """``(function, label) -> ONNX node`` from the spans Relay's frontends set on each call.

    The labels are the Relay adapter's (``%3``, or a let variable), from the same lowering its
    ``fold`` does, so they match the report's. A span's name is ``<output>@@<node>`` or the
    node's name alone.
    """
    from .._core.report import StepTimer
    from ..relay._pass import analyse

    layers: Dict[Tuple[str, str], str] = {}
    lowered = analyse(mod, "default", None, StepTimer()).lowered
    for node, site in zip(lowered.nodes, lowered.sites):
        span = site.call.span
        name = getattr(getattr(span, "source_name", None), "name", "") if span is not None else ""
        if name:
            layers[(node.function, node.label)] = name.split("@@")[-1]
    return layers


def _check_ir(path: str, mod: Any, ir: str) -> None:
    import tvm

    if not isinstance(mod, tvm.IRModule):
        raise CliError(f"{path}: holds a {type(mod).__name__}, not an IRModule")
    kinds = {type(func).__module__.split(".")[1] for func in mod.functions.values()}
    if ir == "relax" and "relax" not in kinds:
        raise CliError(
            f"{path}: the module has no Relax function; for a Relay module pass --ir relay"
        )
    if ir == "relay" and "relay" not in kinds:
        raise CliError(
            f"{path}: the module has no Relay function; for a Relax module drop --ir relay"
        )


def _parse_onnx(path: str, data: bytes) -> Any:
    try:
        import onnx
    except ImportError as err:
        raise CliError(f"{path}: reading ONNX needs the onnx package (pip install onnx)") from err
    try:
        model = onnx.load_from_string(data)
    except Exception as err:
        raise CliError(f"{path}: not an ONNX model ({type(err).__name__}: {err})") from err
    if not model.graph.node:
        raise CliError(f"{path}: not an ONNX model (no graph nodes)")
    return model


def _import_onnx(path: str, data: bytes, ir: str) -> Tuple[Any, Mapping[Tuple[str, str], str]]:
    model = _parse_onnx(path, data)
    return _frontend_call(lambda: _convert_onnx(model, ir), path)


def _frontend_call(convert: Callable[[], Any], path: str) -> Any:
    # TVM's importers print "Error converting operator ..." to stdout before raising; stdout is
    # the command's output (JSON, say), so that goes nowhere and the error becomes one line.
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            return convert()
    except CliError:
        raise
    except Exception as err:
        message = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        hint = ""
        if "QLinear" in message or "QLinear" in captured.getvalue():
            hint = "; QOperator-format models (QLinearConv, ...) do not import: export the model in QDQ format"
        raise CliError(f"{path}: the ONNX frontend cannot import it: {message}{hint}") from err


def _convert_onnx(model: Any, ir: str) -> Tuple[Any, Mapping[Tuple[str, str], str]]:
    if ir == "relay":
        return _import_onnx_relay(model), {}
    from tvm.relax.frontend.onnx import from_onnx

    with _onnx_layer_names() as recorded:
        mod = from_onnx(model, keep_params_in_input=False)
    return mod, _bind_layer_names(mod, recorded)


def _import_onnx_relay(model: Any) -> Any:
    from tvm import relay

    shapes = {}
    initializers = {init.name for init in model.graph.initializer}
    for value in model.graph.input:
        if value.name not in initializers:
            dims = value.type.tensor_type.shape.dim
            shapes[value.name] = [dim.dim_value if dim.HasField("dim_value") else 1 for dim in dims]
    mod, params = relay.frontend.from_onnx(model, shape=shapes)
    mod["main"] = relay.build_module.bind_params_by_name(mod["main"], params)
    return relay.transform.InferType()(mod)


@contextlib.contextmanager
def _onnx_layer_names() -> Iterator[List[Tuple[str, Any]]]:
    """Record ``(ONNX node name, converted expression)`` for every node Relax's importer converts.

    The importer keeps no node names in the IR; its per-node conversion method is wrapped for
    the duration of one import and restored afterwards. Where that method does not exist (another
    TVM release), nothing is recorded and the report names variables only.
    """
    recorded: List[Tuple[str, Any]] = []
    try:
        from tvm.relax.frontend.onnx import onnx_frontend

        importer = onnx_frontend.ONNXGraphImporter
        original = importer._convert_operator
    except (ImportError, AttributeError):
        yield recorded
        return

    def convert(self: Any, op_name: str, inputs: Any, attrs: Dict[str, Any], opset: int) -> Any:
        result = original(self, op_name, inputs, attrs, opset)
        name = attrs.get("tvm_custom", {}).get("name") or op_name
        recorded.append((name, result))
        return result

    importer._convert_operator = convert
    try:
        yield recorded
    finally:
        importer._convert_operator = original


def _bind_layer_names(mod: Any, recorded: List[Tuple[str, Any]]) -> Mapping[Tuple[str, str], str]:
    """``(function, var) -> ONNX node`` for ``main``'s bindings.

    A converter's result is bound either at once or at its first use, inside a later node's
    conversion (a weight's ``dequantize`` is bound where the conv reads it). A binding that
    matches a node converted after every node matched so far is that node's result, and the
    unmatched bindings just before it are its helpers (a conv's ``conv2d`` and bias ``reshape``
    under the final ``add``); a binding matching an earlier node is a late-bound result, named
    by itself.
    """
    from tvm import relax

    from ..relax import _compat

    if "main" not in [gvar.name_hint for gvar in mod.functions] or not recorded:
        return {}
    func = mod["main"]
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return {}
    order = {expr: (index, name) for index, (name, expr) in enumerate(recorded)}
    pending: List[str] = []
    latest = -1
    layers: Dict[Tuple[str, str], str] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            label = _compat.var_name(binding.var)
            found = _lookup(order, binding.var) or _lookup(order, binding.value)
            if found is None:
                pending.append(label)
                continue
            index, name = found
            layers[("main", label)] = name
            if index > latest:
                for helper in pending:
                    layers[("main", helper)] = name
                pending, latest = [], index
    return layers


def _lookup(names: Mapping[Any, Tuple[int, str]], expr: Any) -> Optional[Tuple[int, str]]:
    # TVM objects hash and compare by identity of the underlying node, which is what is wanted:
    # the very expression the converter returned.
    try:
        return names.get(expr)
    except TypeError:
        return None


def _load_json(path: str, data: bytes) -> Any:
    import tvm

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CliError(f"{path}: not a TVM JSON file (not UTF-8 text)") from err
    if not text.lstrip().startswith("{"):
        raise CliError(f"{path}: not a TVM JSON file (tvm.ir.save_json output starts with '{{')")
    try:
        return tvm.ir.load_json(text)
    except Exception as err:
        raise CliError(f"{path}: not a TVM JSON file: {str(err).strip().splitlines()[-1]}") from err


def _load_tvmscript(path: str, data: bytes) -> Any:
    import tvm

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CliError(f"{path}: not a TVMScript file (not UTF-8 text)") from err
    # First as TVMScript text (what IRModule.script() prints), which runs no user code; then as a
    # Python file that defines an IRModule (with its own imports and decorators).
    try:
        return tvm.script.from_source(text)
    except Exception:  # noqa: BLE001 - any parse failure: try it as a Python program
        pass
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            namespace = runpy.run_path(path, run_name="__fold_guard_model__")
    except Exception as err:
        raise CliError(
            f"{path}: not a TVMScript file holding an IRModule: {type(err).__name__}: {err}"
        ) from err
    modules = {name: value for name, value in namespace.items() if isinstance(value, tvm.IRModule)}
    if len(modules) != 1:
        found = ", ".join(sorted(modules)) or "none"
        raise CliError(f"{path}: expected exactly one IRModule at top level, found {found}")
    return next(iter(modules.values()))
