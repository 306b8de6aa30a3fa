"""Under pass management, ``fold_guard.relay.FoldConstant`` is indistinguishable from the stock pass.

Stock Relay ``FoldConstant`` is a FunctionPass named ``FoldConstant`` at opt_level 2. Measured
on hhb-tvm 3.2.3 (TVM 0.16), a pass instrument inside
``Sequential([InferType(), FoldConstant(), DeadCodeElimination()])`` at opt_level 3 sees::

    sequential
      InferType
      FoldConstant
        InferType            <- the FunctionPass re-types its result in the caller's context
      InferType              <- Sequential runs DeadCodeElimination's required InferType
      DeadCodeElimination

The interpreter's own passes (FuseOps, LowerTE, ...) run in a fresh PassContext and are not seen.
Ours must show exactly that: its typing of the input copy is out of sight, its re-typing of the
result is the nested one. (On 0.16 ``PassContext(trace=...)`` takes a Relax tuning trace, not
the old callback of ``test_print_debug_callback``: instruments are how passes are observed.)
"""

from __future__ import annotations

import logging
from typing import Callable, List, Tuple

import numpy as np
import pytest
import tvm
from tvm import relay

import fold_guard.relay as fgr

#: (before/after, pass name, opt_level) as an instrument sees them.
Seen = List[Tuple[str, str, int]]


@tvm.instrument.pass_instrument
class Recorder:
    """Records every pass an instrument is shown, in order."""

    def __init__(self) -> None:
        self.seen: Seen = []

    def run_before_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        self.seen.append(("before", str(info.name), int(info.opt_level)))

    def run_after_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        self.seen.append(("after", str(info.name), int(info.opt_level)))


def _module() -> tvm.IRModule:
    """``add(x, x) * 2 + exp(C)``: exp(C) folds, the rest depends on x."""
    x = relay.var("x", shape=(1, 2, 3), dtype="float32")
    y = relay.multiply(relay.add(x, x), relay.const(2.0, "float32"))
    body = relay.add(y, relay.exp(relay.const(np.ones((1, 2, 3), "float32"))))
    return tvm.IRModule({"main": relay.Function([x], body)})


def _qnn_module() -> tvm.IRModule:
    """A weight ``qnn.quantize(<fp32 const>)`` under ``qnn.dense``: only fold_qnn / fold-qnn folds it."""
    weight = relay.qnn.op.quantize(
        relay.const(np.linspace(-1, 1, 8, dtype="float32").reshape(2, 4)),
        relay.const(0.5),
        relay.const(0),
        out_dtype="int8",
    )
    x = relay.var("x", shape=(2, 4), dtype="int8")
    dense = relay.qnn.op.dense(
        x, weight, relay.const(0), relay.const(0), relay.const(0.5), relay.const(0.5), units=2
    )
    return tvm.IRModule.from_expr(relay.Function([x], dense))


PAIRS: List[
    Tuple[
        str,
        Callable[[], tvm.IRModule],
        Callable[[], tvm.transform.Pass],
        Callable[[], tvm.transform.Pass],
    ]
] = [
    ("default", _module, lambda: relay.transform.FoldConstant(), lambda: fgr.FoldConstant()),
    (
        "fold-qnn",
        _qnn_module,
        lambda: relay.transform.FoldConstant(fold_qnn=True),
        lambda: fgr.FoldConstant("fold-qnn"),
    ),
]


def _pipeline(folding: tvm.transform.Pass) -> tvm.transform.Pass:
    return tvm.transform.Sequential(
        [relay.transform.InferType(), folding, relay.transform.DeadCodeElimination()]
    )


def _run_seen(
    mod: tvm.IRModule, folding: tvm.transform.Pass, **context: object
) -> Tuple[tvm.IRModule, Seen]:
    recorder = Recorder()
    with tvm.transform.PassContext(instruments=[recorder], **context):  # type: ignore[arg-type]
        out = _pipeline(folding)(mod)
    return out, recorder.seen


@pytest.mark.parametrize("name, build, stock, ours", PAIRS, ids=[pair[0] for pair in PAIRS])
def test_instrument_sees_the_stock_sequence(name, build, stock, ours) -> None:
    """Same passes, same nesting, same opt_levels; and the same output."""
    stock_out, stock_seen = _run_seen(build(), stock(), opt_level=3)
    ours_out, ours_seen = _run_seen(build(), ours(), opt_level=3)
    names = [(when, pass_name) for when, pass_name, _ in stock_seen]
    assert names == [
        ("before", "sequential"),
        ("before", "InferType"),
        ("after", "InferType"),
        ("before", "FoldConstant"),
        ("before", "InferType"),
        ("after", "InferType"),
        ("after", "FoldConstant"),
        ("before", "InferType"),
        ("after", "InferType"),
        ("before", "DeadCodeElimination"),
        ("after", "DeadCodeElimination"),
        ("after", "sequential"),
    ], "stock's sequence changed: this test documents the one measured on TVM 0.16"
    assert ours_seen == stock_seen
    tvm.ir.assert_structural_equal(ours_out, stock_out, map_free_vars=True)
    assert not tvm.ir.structural_equal(
        ours_out, relay.transform.InferType()(build()), map_free_vars=True
    )


def test_pass_info_is_the_stock_passes() -> None:
    ours, stock = fgr.FoldConstant(), relay.transform.FoldConstant()
    assert (
        (ours.info.name, ours.info.opt_level)
        == (stock.info.name, stock.info.opt_level)
        == ("FoldConstant", 2)
    )
    assert list(ours.info.required) == list(stock.info.required) == []
    assert ours.implementation == "fold_guard.relay.FoldConstant"
    assert fgr.FoldConstant("fold-qnn").policy.name == "fold-qnn"


# Each: (PassContext arguments, whether a FoldConstant in a Sequential runs under them).
GATING = [
    ({"opt_level": 3}, True),
    ({"opt_level": 2}, True),
    ({"opt_level": 1}, False),
    ({"opt_level": 0}, False),
    ({"opt_level": 3, "disabled_pass": ["FoldConstant"]}, False),
    ({"opt_level": 1, "required_pass": ["FoldConstant"]}, True),
    (
        {"opt_level": 3, "disabled_pass": ["fold_guard.FoldConstant"]},
        True,
    ),  # the old name means nothing now
]


@pytest.mark.parametrize("context, runs", GATING, ids=[str(context) for context, _ in GATING])
def test_gating_is_the_stock_passes(context, runs) -> None:
    """disabled_pass / required_pass / opt_level switch ours exactly where they switch stock."""
    typed = relay.transform.InferType()(_module())
    outputs = {}
    for who, folding in (("stock", relay.transform.FoldConstant()), ("ours", fgr.FoldConstant())):
        out, seen = _run_seen(_module(), folding, **context)
        outputs[who] = out
        assert (("before", "FoldConstant", 2) in seen) is runs, who
        assert tvm.ir.structural_equal(out, typed, map_free_vars=True) is not runs, who
    tvm.ir.assert_structural_equal(outputs["ours"], outputs["stock"], map_free_vars=True)


def test_internal_passes_do_not_leak_into_an_outer_context() -> None:
    """Called directly under an instrumented context, ours shows one nested InferType, as stock."""
    typed = relay.transform.InferType()(_module())
    for folding in (relay.transform.FoldConstant(), fgr.FoldConstant()):
        recorder = Recorder()
        with tvm.transform.PassContext(opt_level=3, instruments=[recorder]):
            folding(typed)
        assert [(when, name) for when, name, _ in recorder.seen] == [
            ("before", "FoldConstant"),
            ("before", "InferType"),
            ("after", "InferType"),
            ("after", "FoldConstant"),
        ]


def test_log_line_names_the_implementation(caplog: pytest.LogCaptureFixture) -> None:
    """The report's INFO line says who folded (the PassInfo says only ``FoldConstant``)."""
    with caplog.at_level(logging.INFO, logger="fold_guard"):
        fgr.FoldConstant()(_module())
    reports = [
        record.getMessage() for record in caplog.records if "constants:" in record.getMessage()
    ]
    assert len(reports) == 1
    assert reports[0].startswith(
        "fold_guard.relay.FoldConstant: fold plan under policy 'default': 1 folded"
    )
