"""``fold --check``: build the module before and after on the CPU and compare their outputs.

Inputs come from ``--inputs FILE.npz`` by name, else are random with a fixed seed, drawn per
parameter of ``main`` from its declared shape and dtype, so a check is reproducible and the two
builds see the same data. An integer parameter that indexes a table (the indices of a ``take``:
token ids into an embedding, ONNX ``Gather``), directly or through casts, reshapes and the
``where`` an importer wraps negative indices in, is drawn in ``[0, rows)``: out of range, PyTorch
raises and TVM's ``take`` reads outside the table, so the two builds could differ for no fault
of the fold. Where TVM cannot build the *unfolded* module there is nothing to compare with:
:class:`UnfoldedUnbuildable` says so (the command writes the fold and exits 4).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from ._errors import CliError

__all__ = [
    "CheckResult",
    "UnfoldedUnbuildable",
    "compare_outputs",
    "index_bounds",
    "load_inputs",
    "random_inputs",
]

#: ``(name, shape, dtype)`` of each parameter of ``main``
Signature = Sequence[Tuple[str, Tuple[int, ...], str]]

#: Calls that pass their (first, or where's value) operand's values on unchanged, for the
#: question "does this parameter end up as a take's indices": per IR.
_PASS_THROUGH = {
    "relax": {
        "relax.astype",
        "relax.reshape",
        "relax.expand_dims",
        "relax.squeeze",
        "relax.permute_dims",
        "relax.flatten",
        "relax.where",
    },
    "relay": {"cast", "reshape", "expand_dims", "squeeze", "transpose", "where"},
}
_TAKE = {"relax": "relax.take", "relay": "take"}


class UnfoldedUnbuildable(Exception):
    """TVM could not build or run the module as loaded, before any fold: nothing to compare."""


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
    signature: Signature,
    seed: int,
    bounds: Optional[Mapping[str, int]] = None,
    given: Optional[Mapping[str, np.ndarray]] = None,
) -> List[np.ndarray]:
    """One array per ``(name, shape, dtype)``: ``given[name]`` where there is one, else normal
    floats, and integers in ``[0, bounds[name])`` for a table index, else in the dtype's small
    range (``[-128, 127]``)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for name, shape, dtype in signature:
        if given is not None and name in given:
            arrays.append(given[name])
        elif np.issubdtype(np.dtype(dtype), np.floating):
            arrays.append(rng.standard_normal(shape).astype(dtype))
        elif dtype == "bool":
            arrays.append(rng.integers(0, 2, shape).astype(bool))
        elif bounds and name in bounds:
            arrays.append(rng.integers(0, bounds[name], shape).astype(dtype))
        else:
            info = np.iinfo(np.dtype(dtype))
            arrays.append(
                rng.integers(max(info.min, -128), min(info.max, 127) + 1, shape).astype(dtype)
            )
    return arrays


def load_inputs(path: str, signature: Signature) -> Dict[str, np.ndarray]:
    """The arrays of ``--inputs path`` by name, each checked against ``main``'s signature."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError) as err:
        raise CliError(f"--inputs {path}: not a NumPy .npz file: {err}") from err
    expected = {name: (shape, dtype) for name, shape, dtype in signature}
    for name, array in arrays.items():
        if name not in expected:
            raise CliError(
                f"--inputs {path}: main has no input {name!r}; its inputs: "
                + ", ".join(f"{n} {list(s)} {d}" for n, (s, d) in expected.items())
            )
        shape, dtype = expected[name]
        if tuple(array.shape) != shape or str(array.dtype) != dtype:
            raise CliError(
                f"--inputs {path}: {name} is {array.dtype!s}{list(array.shape)}, main takes "
                f"{dtype}{list(shape)}"
            )
    return arrays


def index_bounds(mod: Any, ir: str) -> Dict[str, int]:
    """Per integer parameter of ``main`` that a ``take`` reads as indices: the rows of its table
    (the smallest, where several tables are indexed). Read from the module, nothing run."""
    found: Dict[str, int] = {}
    carries: Dict[Any, Set[str]] = {param: {_name(param)} for param in mod["main"].params}
    for var, call in _calls(mod, ir):
        op = call.op.name if hasattr(call.op, "name") else ""
        args = list(call.args)
        if op in _PASS_THROUGH[ir] and args:
            values = args[1:] if op.endswith("where") else args[:1]
            carried = set().union(*(carries.get(a, set()) for a in values))
            if carried:
                carries[var] = carried
        elif op == _TAKE[ir] and len(args) >= 2:
            rows = _rows(args[0], call.attrs)
            for name in carries.get(args[1], set()):
                if rows is not None and rows > 0:
                    found[name] = min(rows, found.get(name, rows))
    return found


def _name(var: Any) -> str:
    return str(getattr(var, "name_hint", None) or getattr(var, "name", ""))


def _rows(table: Any, attrs: Any) -> Optional[int]:
    """The size of the indexed axis of ``table`` (its element count for no axis), if static."""
    ty = getattr(table, "checked_type", None) or getattr(table, "ty", None)
    shape = getattr(ty, "shape", None)
    values = getattr(shape, "values", shape)
    if values is None:
        return None
    try:
        dims = [int(getattr(dim, "value", dim)) for dim in values]
    except (TypeError, ValueError):
        return None
    axis = getattr(attrs, "axis", None)
    if axis is None:
        return int(np.prod(dims)) if dims else None
    return dims[int(axis) % len(dims)] if dims else None


def _calls(mod: Any, ir: str) -> List[Tuple[Any, Any]]:
    """``(bound variable or the call itself, call)`` of ``main``, operands before their users."""
    if ir == "relax":
        from tvm import relax

        return [
            (binding.var, binding.value)
            for block in mod["main"].body.blocks
            for binding in block.bindings
            if isinstance(binding.value, relax.Call)
        ]
    from tvm import relay

    calls: List[Tuple[Any, Any]] = []
    relay.analysis.post_order_visit(
        mod["main"].body,
        lambda node: calls.append((node, node)) if isinstance(node, relay.Call) else None,
    )
    return calls


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
