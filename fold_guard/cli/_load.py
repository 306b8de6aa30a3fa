"""Reading a model file into an IRModule: ONNX, TVM JSON, TVMScript, TFLite or a PyTorch
ExportedProgram, for Relax (or ONNX and JSON for Relay).

Every failure a user can cause (no such file, not readable, not the format its name says, a
missing external-data file or frontend package, a model the frontend cannot import, no Relay in
this TVM) becomes one :class:`CliError` line naming the file; what a frontend prints or warns on
the way is folded into that line or dropped.

Loading runs no code from the model file unless asked to (``trust_model=True``,
``--trust-model``): a ``.py`` is parsed as TVMScript text, and run as a Python program only when
trusted; a ``.pt2`` is read only when trusted, because ``torch.export.load`` unpickles parts of
it (torch's own documentation: never load one from an untrusted source).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import os
import re
import runpy
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple

from ._errors import CliError
from ._explorer import (
    TFLiteRecording,
    onnx_explorer_graph,
    tflite_converter,
    tflite_explorer_graph,
    tflite_layers,
)
from ._node_data import ExplorerGraph
from ._parser import IR_CHOICES, MODEL_SUFFIXES

__all__ = ["IR_CHOICES", "LoadedModel", "load_model", "require_relay"]

#: Formats each IR reads (Relay's TFLite and PyTorch frontends are not wired here).
_FORMATS = {
    "relax": ("onnx", "json", "tvmscript", "tflite", "exported_program"),
    "relay": ("onnx", "json"),
}


@dataclass(frozen=True)
class LoadedModel:
    """A model file read into ``mod`` of IR ``ir``.

    ``layers`` maps ``(function, label)`` to the layer a call belongs to, ``sources`` to the
    frontend node that produced it (:mod:`fold_guard.relax.frontends._layers`); both are empty where the format has no
    node names (TVM JSON, TVMScript).
    """

    path: str
    format: str
    ir: str
    mod: Any
    layers: Mapping[Tuple[str, str], str] = field(default_factory=dict)
    sources: Mapping[Tuple[str, str], str] = field(default_factory=dict)
    #: ONNX / TFLite into Relax: where each call is in Model Explorer's graph of the file
    #: (:mod:`._explorer`); None for other formats
    explorer: Optional[ExplorerGraph] = None


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


def load_model(
    path: str,
    *,
    ir: str = "relax",
    fq2i: bool = False,
    trust_model: bool = False,
    weights_as_params: bool = False,
) -> LoadedModel:
    """Read ``path`` (format by suffix) into a module of ``ir``.

    Parameters
    ----------
    path : str
        An ``.onnx`` model (weights become constants; external data is read from beside the
        model), a ``.json`` file written by ``tvm.ir.save_json``, a ``.py`` TVMScript file
        holding one IRModule, a ``.tflite`` flatbuffer or a ``.pt2`` ExportedProgram.
    ir : {"relax", "relay"}
        The IR to import a model into; a JSON or TVMScript module must already be of it.
    fq2i : bool
        Relay only: run ``FakeQuantizationToInteger`` after the import.
    trust_model : bool
        Allow the loading steps that can run code from the file: running a ``.py`` that is not
        TVMScript text as a Python program, unpickling a ``.pt2``.
    weights_as_params : bool
        Relax, ``.onnx`` only: the weights become parameters of ``main`` from its ``num_input``
        on (``from_onnx(..., keep_params_in_input=True)``, the values detached), so a plan says
        what ``LiftTransformParams`` would lift.

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
    fmt = MODEL_SUFFIXES.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        raise CliError(
            f"{path}: unknown model format; expected .onnx, .json (tvm.ir.save_json), "
            ".py (TVMScript), .tflite or .pt2 (torch.export.save)"
        )
    if fmt not in _FORMATS[ir]:
        raise CliError(f"{path}: --ir {ir} reads {', '.join(_FORMATS[ir])} files, not {fmt}")
    if not os.access(path, os.R_OK):
        raise CliError(f"{path}: cannot read: permission denied")
    if weights_as_params and (fmt != "onnx" or ir != "relax"):
        raise CliError(f"{path}: --weights-as-params reads .onnx models into Relax only")
    layers: Mapping[Tuple[str, str], str] = {}
    sources: Mapping[Tuple[str, str], str] = {}
    explorer = None
    if fmt == "onnx":
        mod, layers, sources, explorer = _import_onnx(path, ir, weights_as_params)
    elif fmt == "json":
        if ir == "relay":
            # Relay's node types exist in Python only once tvm.relay is imported: load_json
            # would otherwise give untyped objects and the module no Relay function
            import tvm.relay  # noqa: F401
        mod = _load_json(path, _read(path))
    elif fmt == "tvmscript":
        mod = _load_tvmscript(path, _read(path), trust_model)
    elif fmt == "tflite":
        mod, layers, sources, explorer = _import_tflite(path, _read(path))
    else:
        mod = _import_exported_program(path, trust_model)
    _check_ir(path, mod, ir)
    if fq2i:
        from tvm import relay

        mod = relay.transform.FakeQuantizationToInteger()(relay.transform.InferType()(mod))
    if ir == "relay":
        layers = sources = _relay_layer_names(mod)
    return LoadedModel(path, fmt, ir, mod, layers, sources, explorer)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as err:
        raise CliError(f"{path}: cannot read: {err.strerror}") from err


def _relay_layer_names(mod: Any) -> Mapping[Tuple[str, str], str]:
    """``(function, label) -> ONNX node`` from the spans Relay's frontends set on each call.

    The labels are the Relay adapter's (``%3``, or a let variable), from the same walk its
    ``fold`` does, so they match the report's. A span's name is ``<output>@@<node>`` or the
    node's name alone.
    """
    from ..relay._translate import analyse

    layers: Dict[Tuple[str, str], str] = {}
    translation = analyse(mod, "default").translation
    for node, site in zip(translation.nodes, translation.sites):
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


def _parse_onnx(path: str) -> Any:
    """The ModelProto at ``path`` with its external data read from beside it, whatever the cwd."""
    try:
        import onnx
        from onnx import external_data_helper
    except ImportError as err:
        raise CliError(f"{path}: reading ONNX needs the onnx package (pip install onnx)") from err
    try:
        model = onnx.load_from_string(_read(path))
    except Exception as err:  # protobuf raises its own DecodeError and others
        raise CliError(f"{path}: not an ONNX model ({type(err).__name__}: {err})") from err
    if not model.graph.node:
        raise CliError(f"{path}: not an ONNX model (no graph nodes)")
    base = os.path.dirname(os.path.abspath(path))
    external = [
        tensor
        for tensor in external_data_helper._get_all_tensors(model)
        if external_data_helper.uses_external_data(tensor)
    ]
    for tensor in external:
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        data = os.path.join(base, location)
        if os.path.commonpath([os.path.realpath(data), os.path.realpath(base)]) != os.path.realpath(
            base
        ):
            raise CliError(
                f"{path}: external data file {location!r} of tensor {tensor.name!r} is outside "
                f"the model's directory {base}; refusing to read it"
            )
        if not location or not os.path.isfile(data):
            raise CliError(
                f"{path}: external data file {location!r} of tensor {tensor.name!r} not found "
                f"beside the model (in {base}); keep the data files next to the .onnx file"
            )
    if external:
        try:
            external_data_helper.load_external_data_for_model(model, base)
        except Exception as err:  # onnx raises ValueError, OSError, its own checks
            raise CliError(f"{path}: cannot read its external data: {_last_line(err)}") from err
    return model


def _import_onnx(path: str, ir: str, weights_as_params: bool = False) -> Tuple[Any, ...]:
    model = _parse_onnx(path)
    return _frontend_call(lambda: _convert_onnx(model, ir, weights_as_params), path, "ONNX")


def _last_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[-1] if text else type(err).__name__


def _frontend_call(convert: Callable[[], Any], path: str, frontend: str) -> Any:
    # TVM's importers print "Error converting operator ..." to stdout and warn on the way;
    # stdout is the command's output (JSON, say), so both go nowhere and an error is one line.
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return convert()
    except CliError:
        raise
    except Exception as err:  # any frontend failure is this file's problem
        message = _last_line(err)
        hint = ""
        if "QLinear" in message or "QLinear" in captured.getvalue():
            hint = "; QOperator-format models (QLinearConv, ...) do not import: export the model in QDQ format"
        raise CliError(
            f"{path}: the {frontend} frontend cannot import it: {message}{hint}"
        ) from err


def _convert_onnx(model: Any, ir: str, weights_as_params: bool = False) -> Tuple[Any, ...]:
    if ir == "relay":
        return _import_onnx_relay(model), {}, {}, None
    from tvm.relax.frontend import detach_params
    from tvm.relax.frontend.onnx import from_onnx

    from ..relax.frontends._layers import attribute_bindings, record_onnx_conversions

    with record_onnx_conversions() as recorded:
        mod = from_onnx(model, keep_params_in_input=weights_as_params)
    if weights_as_params:
        mod, _ = detach_params(mod)
    layers, sources = attribute_bindings(mod, recorded)
    return mod, layers, sources, onnx_explorer_graph(model, mod, recorded)


def _import_tflite(path: str, data: bytes) -> Any:
    try:
        import tflite
    except ImportError as err:
        raise CliError(
            f"{path}: reading TFLite needs the tflite package (pip install tflite)"
        ) from err
    if data[4:8] != b"TFL3":
        raise CliError(f"{path}: not a TFLite flatbuffer (no TFL3 file identifier)")

    def convert() -> Any:
        from tvm.relax.frontend.tflite import from_tflite

        # fold_guard's converter (TVM 0.27's fails on int8 weights behind a DEQUANTIZE op),
        # noting each operator's conversion: the layers, and the nodes of Model Explorer's graph
        model = tflite.Model.GetRootAsModel(data, 0)
        recording = TFLiteRecording()
        mod = from_tflite(model, op_converter=tflite_converter(recording))
        layers, sources = tflite_layers(model, mod, recording)
        return mod, layers, sources, tflite_explorer_graph(model, mod, recording)

    return _frontend_call(convert, path, "TFLite")


def _import_exported_program(path: str, trust_model: bool) -> Any:
    if not trust_model:
        raise CliError(
            f"{path}: torch.export.load unpickles an ExportedProgram, which can run code from "
            "the file; pass --trust-model to read one you trust"
        )
    try:
        import torch
    except ImportError as err:
        raise CliError(
            f"{path}: reading a PyTorch ExportedProgram needs torch (pip install torch==2.13.0, a CPU build)"
        ) from err
    if _names_pt2e_ops(path):
        _register_pt2e_ops(path)
    with warnings.catch_warnings(), _torch_export_log() as log:
        warnings.simplefilter("ignore")
        try:
            program = torch.export.load(path)
        except Exception as err:  # torch raises many kinds for a file it cannot read
            missing = _UNRESOLVED_OP.search(log.getvalue())
            if missing is not None:
                raise CliError(
                    f"{path}: the program calls {missing.group(1)}, an operator not registered "
                    "in this process; import the package that defines it with --plugin MODULE"
                ) from err
            raise CliError(
                f"{path}: not a saved ExportedProgram (torch.export.save): {_last_line(err)}"
            ) from err

    def convert() -> Any:
        from tvm.relax.frontend.torch import from_exported_program

        from ..relax.frontends import torch_quantized_convert_map

        # PT2E's quantize / dequantize ops, which TVM 0.27's importer rejects, as Relax Q/DQ.
        return from_exported_program(program, custom_convert_map=torch_quantized_convert_map())

    return _frontend_call(convert, path, "PyTorch")


#: What torch.export logs for an operator it cannot resolve while loading a program.
_UNRESOLVED_OP = re.compile(r"failed to resolve (torch\.ops\.[\w.]+?)(?:\.default)? to an operator")
#: The namespace of PT2E's quantize / dequantize ops, and the module that defines them (torch's
#: own, which torchao's PT2E flow imports): a fresh process has not registered them.
PT2E_NAMESPACE = b"quantized_decomposed"
PT2E_OPS_MODULE = "torch.ao.quantization.fx._decomposed"


def _names_pt2e_ops(path: str) -> bool:
    """Whether the archive's graph files name PT2E's ops (its weights are not read)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            return any(
                PT2E_NAMESPACE in archive.read(info.filename)
                for info in archive.infolist()
                if info.filename.endswith(".json") and "/models/" in info.filename
            )
    except (OSError, zipfile.BadZipFile):
        return False  # torch.export.load says what is wrong with it


def _register_pt2e_ops(path: str) -> None:
    try:
        importlib.import_module(PT2E_OPS_MODULE)
    except ImportError as err:
        raise CliError(
            f"{path}: the program calls PT2E's quantized_decomposed operators, and this torch "
            f"has no {PT2E_OPS_MODULE} to register them; load the module that defines them with "
            "--plugin MODULE (torchao.quantization.pt2e.quantize_pt2e)"
        ) from err


@contextlib.contextmanager
def _torch_export_log() -> Iterator[io.StringIO]:
    """What ``torch.export`` logs while loading, kept (for the one line) instead of printed."""
    import logging

    logger = logging.getLogger("torch.export")
    kept = io.StringIO()
    handler = logging.StreamHandler(kept)
    saved = logger.handlers[:], logger.propagate
    logger.handlers[:] = [handler]
    logger.propagate = False
    try:
        yield kept
    finally:
        logger.handlers[:], logger.propagate = saved


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
    except Exception as err:  # load_json raises TVM errors of many kinds
        raise CliError(f"{path}: not a TVM JSON file: {_last_line(err)}") from err


_HEADER_LINE = re.compile(
    r"\s*(#.*|(import [\w.]+(\s+as \w+)?|from [\w.]+ import [\w, ]+)\s*(#.*)?)?\s*"
)


def _without_import_header(text: str) -> str:
    """``text`` less its leading comment, blank and plain import lines (never run either way)."""
    lines = text.splitlines(keepends=True)
    start = 0
    while start < len(lines) and _HEADER_LINE.fullmatch(lines[start]):
        start += 1
    return "".join(lines[start:])


def _load_tvmscript(path: str, data: bytes, trust_model: bool) -> Any:
    import tvm

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CliError(f"{path}: not a TVMScript file (not UTF-8 text)") from err
    # As TVMScript text (what IRModule.script() prints): parsed, never run. The import lines
    # and comments a file starts with (``fold -o OUT.py`` writes some, so that the file also
    # runs as Python) are not TVMScript: the parser gets what follows them.
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tvm.script.from_source(_without_import_header(text))
    except Exception as err:  # the parser raises diagnostics of many kinds
        if not trust_model:
            raise CliError(
                f"{path}: not TVMScript text ({_last_line(err)}); a Python program that builds "
                "an IRModule is run only with --trust-model, which executes the file's code"
            ) from err
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            namespace = runpy.run_path(path, run_name="__fold_guard_model__")
    except Exception as err:  # whatever the user's program raises
        raise CliError(
            f"{path}: running it (--trust-model) failed: {type(err).__name__}: {_last_line(err)}"
        ) from err
    modules = {name: value for name, value in namespace.items() if isinstance(value, tvm.IRModule)}
    if len(modules) != 1:
        found = ", ".join(sorted(modules)) or "none"
        raise CliError(f"{path}: expected exactly one IRModule at top level, found {found}")
    return next(iter(modules.values()))
