"""Reading a Relay module safely: the entry points' check, copies type inference cannot reach, and
the type inference itself.

Relay's ``InferType`` writes types into the functions a module's GlobalVars reach, the caller's
included: every entry point checks the module (:func:`check_relay_module`), then works on a
:func:`detached_copy`, types it (:func:`infer_types`, whose errors name what does not type-check)
and builds its results with :func:`module_like`.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, List, Mapping

import tvm
from tvm import relay

from .._core.errors import PreconditionError
from .._tvm.adapter import check_module
from .._tvm.pass_context import isolated_pass_context
from ._rewrite import remap_global_vars

__all__ = ["check_relay_module", "detached_copy", "infer_types", "module_like"]


def check_relay_module(mod: object) -> tvm.IRModule:
    """``mod``, once it is an IRModule of Relay functions (and PrimFuncs); else UnsupportedIRError."""
    check_module(
        mod,
        "fold_guard.relay",
        (relay.Function, tvm.tir.PrimFunc),
        not_module_hint="tvm.IRModule.from_expr(func) wraps a Relay function, and "
        "fold_guard.relay.fold_function folds one function directly",
        other_ir_hint="; hint: Relax modules go to fold_guard.relax",
        importers={
            "onnx.ModelProto": "relay.frontend.from_onnx(model, freeze_params=True)[0]",
        },
    )
    return mod


def detached_copy(mod: tvm.IRModule) -> tvm.IRModule:
    """The same functions under fresh GlobalVars, so that type inference cannot reach ``mod``.

    Relay's ``InferType`` refreshes the cached type of every function reachable through the
    module's GlobalVars in place (stock passes change their input's cached types this way). With
    fresh GlobalVars and new function objects it builds new typed nodes and leaves the caller's
    module exactly as it was; constants are shared, not copied.
    """
    fresh = {gvar: relay.GlobalVar(gvar.name_hint) for gvar in mod.get_global_vars()}
    functions = {}
    for gvar, func in mod.functions.items():
        functions[fresh[gvar]] = (
            remap_global_vars(func, fresh) if isinstance(func, relay.Function) else func
        )
    return module_like(mod, functions)


def module_like(
    mod: tvm.IRModule, functions: Mapping[relay.GlobalVar, tvm.ir.BaseFunc]
) -> tvm.IRModule:
    """A module of ``functions`` with ``mod``'s type definitions and attributes."""
    new_mod = tvm.IRModule(dict(functions), mod.type_definitions)
    if mod.attrs is not None:
        for key in mod.attrs.keys():
            new_mod = new_mod.with_attr(key, mod.attrs[key])
    return new_mod


def infer_types(mod: tvm.IRModule, what: str, *, visible: bool) -> tvm.IRModule:
    """``InferType()(mod)``; ``visible`` says whether the caller's pass instruments may see it.

    Stock ``FoldConstant`` is a FunctionPass, which re-types its result with one ``InferType``
    run in the caller's PassContext: instruments see that one nested inside ``FoldConstant``,
    and nothing else. Typing our detached copy of the input has no counterpart in stock, so it
    runs out of their sight.
    """
    if not visible:
        with isolated_pass_context():
            return infer_types(mod, what, visible=True)
    # TVM reports type errors as diagnostics printed to stderr and raises a generic "error
    # diagnostics were emitted"; collect them so the exception itself names what is wrong.
    messages: List[str] = []

    def collect(context: object) -> None:
        messages.extend(str(diagnostic.message) for diagnostic in context.diagnostics)  # type: ignore[attr-defined]

    with _diagnostics_renderer(collect):
        try:
            return relay.transform.InferType()(mod)
        except tvm.TVMError as err:
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            why = "; ".join(messages) or (lines[-1] if lines else str(err))
            raise PreconditionError(
                f"{what} does not type-check, so fold_guard cannot tell what is constant: {why}. "
                "Hint: run relay.transform.InferType() on it to see where"
            ) from err


#: The global function through which ``tvm.ir.diagnostics.override_renderer`` installs a renderer.
_RENDERER_FUNC = "diagnostics.OverrideRenderer"


@contextlib.contextmanager
def _diagnostics_renderer(render: Callable[[object], None]) -> Iterator[None]:
    """Report diagnostics through ``render`` inside the block, then restore the caller's renderer.

    The renderer is process-wide: a user's own (installed with ``override_renderer``) is put back
    as it was, and TVM's default only when there was none.
    """
    previous = tvm.get_global_func(_RENDERER_FUNC, allow_missing=True)
    tvm.ir.diagnostics.override_renderer(render)
    try:
        yield
    finally:
        if previous is None:
            tvm.ir.diagnostics.override_renderer(None)
        else:
            tvm.register_func(_RENDERER_FUNC, previous, override=True)
