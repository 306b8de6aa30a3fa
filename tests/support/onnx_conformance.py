"""ONNX's backend node test cases as an outside conformance corpus, for both IRs' test files.

``onnx.backend.test.case.node.collect_testcases()`` ships with the onnx package: about 1,900
single-operator models, each with reference inputs and outputs, written by nobody here. Each
case is imported three ways (:data:`BINDINGS`, :func:`bound_model`): its graph inputs bound as
initializers, so that an importer run with weights as constants gives a module whose every call
computes from constants; as ONNX ships it, its graph inputs left as run-time parameters; and with
only the first input run-time and the rest bound. The stock pass and fold_guard's then fold each,
and the test files compare the two (RFC.md, guarantees 1 and 7).

:func:`sample` picks the full lane's cases: every :data:`SAMPLE_EVERY`-th case by name, plus one
case of each divergence the corpus found (:data:`KNOWN_CASES`), so that CI keeps them covered.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

#: Every this-many-th case (by name) goes into the full lane's sample.
SAMPLE_EVERY = 25

#: Cases that once diverged from stock, by cause (issue 33), always in the sample.
KNOWN_CASES = (
    "test_gelu_default_1_expanded",  # a divisor folded earlier in the same pass
    "test_nllloss_NC_expanded",
    "test_lppool_2d_strides",  # pow(x, 0.5) compiled to sqrt by stock
    "test_lppool_2d_same_upper",
    "test_compress_0",  # match_cast(nonzero(c)): stock normalizes it
    "test_nonzero_example",
    "test_reduce_max_empty_set",  # a reduction over an empty axis: unwritten memory
    "test_reduce_log_sum_exp_empty_set",
    "test_reduce_max_bool_inputs",  # stock raises
    "test_resize_upsample_scales_linear_half_pixel_symmetric",
    "test_rms_normalization_2d_axis0",
    "test_split_zero_size_splits_opset18",
    "test_scan_sum",  # a recursive let (Relay)
    "test_loop11",
    # run-time inputs (issue 39): a kernel that reads only an input's shape folds as in stock
    "test_eyelike_without_dtype",
    "test_group_normalization_example",
    "test_shrink_hard",
    "test_slice",  # dynamic_strided_slice on run-time bounds: stock's output is ill-formed
)

#: How a case's graph inputs reach the importer.
CONSTANTS = "constants"  # every input bound as an initializer: every call computes from constants
AS_SHIPPED = "as shipped"  # every input left a graph input, as ONNX ships it: run-time parameters
FIRST_RUNTIME = "first input run-time"  # the first input left a graph input, the rest bound
BINDINGS = (CONSTANTS, AS_SHIPPED, FIRST_RUNTIME)

#: What a case came to, for the figures: counts per outcome.
NOT_BOUND = "inputs not tensors"
NOT_IMPORTED = "not imported"
EQUAL = "equal to stock"
STOCK_RAISES = "stock raises (kept with a reason)"
UNWRITTEN = "unwritten memory (kept)"
ILL_FORMED = "stock's output ill-formed (call kept)"


@functools.lru_cache(maxsize=1)
def node_cases() -> Tuple[object, ...]:
    """Every node test case of the installed onnx, sorted by name."""
    from onnx.backend.test.case import node

    collect = node.collect_testcases
    # onnx 1.16 (the Relay environment) asks which op; None takes them all
    cases = collect(None) if inspect.signature(collect).parameters else collect()
    return tuple(sorted(cases, key=lambda case: case.name))


def sample(cases: Sequence[object]) -> List[object]:
    """The full lane's deterministic sample of ``cases``."""
    known = set(KNOWN_CASES)
    return [c for i, c in enumerate(cases) if i % SAMPLE_EVERY == 0 or c.name in known]


def bound_model(
    case: object, binding: str = CONSTANTS
) -> Optional[Tuple[object, List[np.ndarray]]]:
    """The case's model with its graph inputs bound as ``binding`` says (:data:`BINDINGS`) as
    initializers of their reference values, and the reference outputs; None when an input to
    bind is not a tensor (a sequence, an optional)."""
    import onnx
    from onnx import numpy_helper

    if binding not in BINDINGS:
        raise ValueError(f"binding must be one of {BINDINGS}, got {binding!r}")
    inputs, outputs = case.data_sets[0]
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    if binding == AS_SHIPPED:
        return model, list(outputs)
    graph = model.graph
    initialized = {init.name for init in graph.initializer}
    graph_inputs = [i for i in graph.input if i.name not in initialized]
    if len(inputs) != len(graph_inputs):
        return None
    start = 1 if binding == FIRST_RUNTIME else 0
    for info, value in list(zip(graph_inputs, inputs))[start:]:
        if isinstance(value, onnx.TensorProto):
            tensor = onnx.TensorProto()
            tensor.CopyFrom(value)
            tensor.name = info.name
        elif isinstance(value, (np.ndarray, np.generic)):
            tensor = numpy_helper.from_array(np.asarray(value), info.name)
        else:
            return None
        graph.initializer.append(tensor)
    kept = graph_inputs[:start] + [i for i in graph.input if i.name in initialized]
    del graph.input[:]
    graph.input.extend(kept)
    return model, list(outputs)


def matches(values: Sequence[np.ndarray], reference: Sequence[object], case: object) -> bool:
    """Whether folded output ``values`` equal the case's reference outputs (its tolerances)."""
    if len(values) != len(reference):
        return False
    for value, want in zip(values, reference):
        want = np.asarray(want)
        if value.shape != want.shape:
            return False
        if want.dtype.kind in "fc":
            if not np.allclose(value, want, rtol=case.rtol, atol=case.atol, equal_nan=True):
                return False
        elif not np.array_equal(value, want):
            return False
    return True


@dataclass(frozen=True)
class Side:
    """What a test file gives for its IR: how a case's model imports, how each pass folds it,
    structural equality, and ``main``'s outputs where a fold made them all constants.

    ``well_formed`` and ``without_dangling`` (Relax: stock's output less the bindings that call
    a PrimFunc missing from the module, normalized) tell the third intended difference.
    """

    name: str
    import_model: Callable[[Any], Any]
    stock: Callable[[Any], Any]
    fold: Callable[[Any], Any]
    equal: Callable[[Any, Any], bool]
    constant_outputs: Callable[[Any], Optional[List[np.ndarray]]]
    save: Callable[[Any], str]
    well_formed: Callable[[Any], bool] = lambda mod: True
    without_dangling: Optional[Callable[[Any], Any]] = None


def check(case: Any, side: Side, tally: Tally, binding: str = CONSTANTS) -> None:
    """Fold ``case`` both ways and record its outcome in ``tally`` (a problem as a failure)."""
    from fold_guard import Action, Reason

    bound = bound_model(case, binding)
    if bound is None:
        tally.outcomes[case.name] = NOT_BOUND
        return
    model, reference = bound
    try:  # the importer prints each operator it cannot convert
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            mod = side.import_model(model)
    except Exception:  # noqa: BLE001 - the importer's limits are not what this corpus tests
        tally.outcomes[case.name] = NOT_IMPORTED
        return
    saved = side.save(mod)
    result = side.fold(mod)  # first: a stock pass may refresh the input's cached types
    problems: List[str] = []
    if side.save(mod) != saved:
        problems.append("the input module changed")
    try:
        stock = side.stock(mod)
    except Exception:  # noqa: BLE001 - an intended difference: checked below
        stock = None
    kept = [d for d in result.plan.decisions if d.action is Action.KEEP]
    if stock is None:
        outcome = STOCK_RAISES
        cannot = (Reason.UNSUPPORTED, Reason.EVAL_FAILED, Reason.KEPT_BY_POLICY)
        if binding != CONSTANTS:
            # stock legalizes every call, those on run-time values too, and raises where a
            # legalizer does (a reshape to a shape known only at run time); ours keeps it as
            # not constant, never asking that legalizer
            cannot += (Reason.NOT_CONSTANT,)
        if not any(d.reason in cannot and d.detail for d in kept):
            problems.append(
                f"stock raises, but no call is kept with a reason:\n{result.plan.explain()}"
            )
        if side.well_formed(mod) and not side.well_formed(result.mod):
            problems.append("stock raises, and our output is not well formed (its input was)")
    elif side.equal(result.mod, stock):
        outcome = EQUAL
        stock_values = side.constant_outputs(stock)
        if stock_values is not None and matches(stock_values, reference, case):
            ours = side.constant_outputs(result.mod)
            if ours is None or not matches(ours, reference, case):
                problems.append("stock's folded outputs equal the reference outputs, ours do not")
    elif any(d.reason is Reason.UNWRITTEN_MEMORY for d in kept):
        outcome = UNWRITTEN
    elif (
        side.without_dangling is not None
        and not side.well_formed(stock)
        and side.well_formed(result.mod)
        and side.equal(result.mod, side.without_dangling(stock))
    ):
        outcome = ILL_FORMED
    else:
        outcome = "different"
        problems.append(f"not equal to stock:\n{result.mod}\nstock:\n{stock}")
    tally.outcomes[case.name] = outcome
    tally.failures += [f"{case.name}: {problem}" for problem in problems]


def run(cases: Sequence[Any], side: Side, binding: str = CONSTANTS) -> Tally:
    """Every case checked; prints the figure (run pytest with ``-s`` to see it)."""
    tally = Tally({}, [])
    for case in cases:
        check(case, side, tally, binding)
    print(f"\nONNX node tests on {side.name}, inputs {binding}: {tally.figure()}")
    return tally


@dataclass
class Tally:
    """Outcomes per case, and the failures (a case that is neither equal nor an intended difference)."""

    outcomes: Dict[str, str]
    failures: List[str]

    def figure(self) -> str:
        counts: Dict[str, int] = {}
        for outcome in self.outcomes.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        imported = sum(n for kind, n in counts.items() if kind not in (NOT_BOUND, NOT_IMPORTED))
        parts = [f"{len(self.outcomes)} cases, {imported} imported"]
        kinds = (EQUAL, STOCK_RAISES, UNWRITTEN, ILL_FORMED)
        parts += [f"{counts.get(kind, 0)} {kind}" for kind in kinds]
        return "; ".join(parts) + f"; {len(self.failures)} failures"
