"""``fold --check``: build the module before and after on the CPU and compare their outputs.

Inputs are random with a fixed seed, drawn per parameter of ``main`` from its declared shape
and dtype, so a check is reproducible and the two builds see the same data.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any, List, Sequence, Tuple

import numpy as np

from ._errors import CliError

__all__ = ["CheckResult", "compare_outputs", "random_inputs"]


@dataclass(frozen=True)
class CheckResult:
    """Largest absolute difference over all outputs, and whether it is within ``atol``."""

    max_abs_diff: float
    atol: float
    outputs: int

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.atol

    def __str__(self) -> str:
        verdict = "same outputs" if self.ok else "OUTPUTS DIFFER"
        return (
            f"check: {verdict} ({self.outputs} outputs, "
            f"max |before - after| = {self.max_abs_diff:g}, atol {self.atol:g})"
        )


def random_inputs(
    signature: Sequence[Tuple[str, Tuple[int, ...], str]], seed: int
) -> List[np.ndarray]:
    """One array per ``(name, shape, dtype)``: normal floats, integers in the dtype's small range."""
    rng = np.random.default_rng(seed)
    arrays = []
    for _, shape, dtype in signature:
        if np.issubdtype(np.dtype(dtype), np.floating):
            arrays.append(rng.standard_normal(shape).astype(dtype))
        elif dtype == "bool":
            arrays.append(rng.integers(0, 2, shape).astype(bool))
        else:
            info = np.iinfo(np.dtype(dtype))
            arrays.append(
                rng.integers(max(info.min, -128), min(info.max, 127) + 1, shape).astype(dtype)
            )
    return arrays


def compare_outputs(
    before: Sequence[np.ndarray], after: Sequence[np.ndarray], atol: float
) -> CheckResult:
    if len(before) != len(after):
        return CheckResult(float("inf"), atol, len(before))
    worst = 0.0
    for a, b in zip(before, after):
        if a.shape != b.shape:
            return CheckResult(float("inf"), atol, len(before))
        if a.size:
            worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))))
    return CheckResult(worst, atol, len(before))


def relax_signature(mod: Any) -> List[Tuple[str, Tuple[int, ...], str]]:
    """``(name, shape, dtype)`` of each parameter of a Relax ``main``; static tensors only."""
    from ..relax import _compat

    if "main" not in [gvar.name_hint for gvar in mod.functions]:
        raise CliError("--check: the module has no main function to run")
    signature = []
    for param in mod["main"].params:
        ty = _compat.type_of(param)
        shape = getattr(ty, "shape", None)
        values = getattr(shape, "values", None)
        if (
            not isinstance(ty, _compat.TensorType)
            or values is None
            or not all(hasattr(v, "value") for v in values)
        ):
            raise CliError(
                f"--check: main's parameter {_compat.var_name(param)} is not a tensor of static shape"
            )
        signature.append(
            (_compat.var_name(param), tuple(int(v.value) for v in values), str(ty.dtype))
        )
    return signature


def run_relax(mod: Any, inputs: Sequence[np.ndarray]) -> List[np.ndarray]:
    import tvm
    from tvm import relax

    exe = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(exe, tvm.cpu())
    return _flatten(
        vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(x), tvm.cpu()) for x in inputs])
    )


def relay_signature(mod: Any) -> List[Tuple[str, Tuple[int, ...], str]]:
    signature = []
    for param in mod["main"].params:
        ty = param.checked_type
        try:
            shape = tuple(int(dim) for dim in ty.shape)
        except (TypeError, AttributeError) as err:
            raise CliError(
                f"--check: main's parameter {param.name_hint} is not a tensor of static shape"
            ) from err
        signature.append((param.name_hint, shape, str(ty.dtype)))
    return signature


def run_relay(mod: Any, inputs: Sequence[np.ndarray]) -> List[np.ndarray]:
    import tvm
    from tvm import relay
    from tvm.contrib import graph_executor

    # Some Relay builds (hhb) default LLVM, and report the "system" triple, as riscv64: name
    # this host's triple explicitly.
    target = f"llvm -mtriple={platform.machine()}-linux-gnu"
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target)
    module = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    for index, array in enumerate(inputs):
        module.set_input(index, array)
    module.run()
    return [module.get_output(i).numpy() for i in range(module.get_num_outputs())]


def _flatten(result: Any) -> List[np.ndarray]:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    outputs: List[np.ndarray] = []
    for item in result:
        outputs.extend(_flatten(item))
    return outputs
