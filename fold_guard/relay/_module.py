"""Reading a Relay module safely: the entry points' check, and copies type inference cannot reach.

Relay's ``InferType`` writes types into the functions a module's GlobalVars reach, the caller's
included: every entry point checks the module (:func:`check_relay_module`), then works on a
:func:`detached_copy`, and builds its results with :func:`module_like`.
"""

from __future__ import annotations

from typing import Mapping

import tvm
from tvm import relay

from .._tvm.adapter import check_module
from ._rewrite import remap_global_vars

__all__ = ["check_relay_module", "detached_copy", "module_like"]


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
