"""Scaffolding both adapters share: the pass object and the check that the input is a module.

Each adapter's ``FoldConstant(...)`` is a module pass registered under the stock pass's name
(:data:`~fold_guard._tvm.pass_context.PASS_NAME`) at the stock pass's ``opt_level``, carrying its
options, whose ``transform_module`` is the adapter's ``fold``; :func:`fold_constant_pass` builds
it. :func:`check_module` refuses what is not an ``IRModule`` of the adapter's IR before anything
reads it.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import tvm

from .._core.errors import UnsupportedIRError
from .._core.policy import FoldPolicy
from .pass_context import PASS_NAME

__all__ = ["FoldConstantPass", "check_module", "fold_constant_pass"]


class FoldConstantPass:
    """The options of one ``FoldConstant(...)``; the pass folds a module with the adapter's ``fold``.

    ``implementation`` says who implements the pass, for users who look (its ``PassInfo`` carries
    the stock name); ``policy`` is the resolved policy; the adapter's own options (Relax
    ``kernel_cache``, Relay ``functions``) are attributes of the same name.
    """

    def __init__(
        self,
        fold: Callable[..., Any],
        implementation: str,
        policy: FoldPolicy,
        strict: bool,
        **options: object,
    ) -> None:
        self._fold = fold
        self._options: Dict[str, object] = dict(options)
        self.implementation = implementation
        self.policy = policy
        self.strict = strict
        for name, value in options.items():
            setattr(self, name, value)

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return self._fold(mod, policy=self.policy, strict=self.strict, **self._options).mod


#: One pass class per stock ``opt_level`` (the level is part of the class's registration).
_PASS_CLASSES: Dict[int, Any] = {}


def fold_constant_pass(
    fold: Callable[..., Any],
    *,
    opt_level: int,
    implementation: str,
    policy: FoldPolicy,
    strict: bool,
    **options: object,
) -> tvm.transform.Pass:
    """A module pass named like the stock ``FoldConstant`` at ``opt_level`` that runs ``fold``."""
    if opt_level not in _PASS_CLASSES:
        _PASS_CLASSES[opt_level] = tvm.transform.module_pass(opt_level=opt_level, name=PASS_NAME)(
            FoldConstantPass
        )
    return _PASS_CLASSES[opt_level](fold, implementation, policy, strict, **options)


def check_module(
    mod: object,
    adapter: str,
    function_types: Tuple[type, ...],
    *,
    not_module_hint: str,
    other_ir_hint: str,
    importers: Optional[Mapping[str, str]] = None,
) -> None:
    """Raise UnsupportedIRError unless ``mod`` is an IRModule whose functions are ``function_types``.

    ``adapter`` names the adapter in messages (``fold_guard.relax``); the hints say what to do
    with something that is not a module, and (ending the message, punctuation included) with a
    function of another IR. ``importers`` maps a frontend's model type (``onnx.ModelProto``) to
    the call that imports it, the hint for a model passed as it is.
    """
    if not isinstance(mod, tvm.IRModule):
        kind = f"{type(mod).__module__.split('.')[0]}.{type(mod).__name__}"
        importer = (importers or {}).get(kind)
        hint = f"import it first: mod = {importer}" if importer else not_module_hint
        raise UnsupportedIRError(
            f"{adapter} expects a tvm.IRModule, got {type(mod).__name__}; hint: {hint}"
        )
    for gvar, func in mod.functions.items():
        if not isinstance(func, function_types):
            raise UnsupportedIRError(
                f"function {gvar.name_hint} is a {type(func).__module__}.{type(func).__name__}, "
                f"which {adapter} cannot read{other_ir_hint}"
            )
