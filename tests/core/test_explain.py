"""What FoldPlan.explain(), FoldReport.explain() and the planner's log say.

White-box on purpose: it tests the TVM-free core (``fold_guard._core``) directly, below the
adapters' public entry points.
"""

import logging

import pytest
from graphdsl import G

from fold_guard._core import (
    DEFAULT_POLICY,
    KEEP_QDQ_WEIGHTS_POLICY,
    Action,
    FoldDecision,
    FoldGraph,
    FoldReport,
    Reason,
    plan_folds,
)


def mixed_plan():
    """
    e = exp(c); b = barrier(e); y = add(x, e); n = neg(b)
        ==>   e = C; b = barrier(C); y = add(x, C); n = neg(b)
    """
    g = G()
    c, x = g.const("c"), g.runtime("x")
    e = g.call("relax.exp", c, label="e")
    b = g.barrier(e, label="b")
    g.call("relax.add", x, e, label="y")
    g.call("relax.negative", b, label="n")
    return plan_folds(g.build(), DEFAULT_POLICY)


EXPECTED_LINES = [
    "fold plan under policy 'default': 1 folded, 2 kept by barrier, 1 not constant",
    "  main: e = relax.exp: folded [default]",
    "  main: b = fold_guard.fold_barrier: kept by barrier [fold_barrier]: operand is constant; "
    "the barrier stays; nothing that consumes it folds",
    "  main: y = relax.add: not constant: 'x' is a run-time input",
    "  main: n = relax.negative: kept by barrier [fold_barrier]: input b is downstream of barrier b",
]


def test_plan_explain_verbose():
    assert mixed_plan().explain().splitlines() == EXPECTED_LINES


def test_plan_explain_brief():
    assert mixed_plan().explain(verbose=False) == EXPECTED_LINES[0]


def test_count_by_reason_in_enum_order_without_zeros():
    counts = mixed_plan().count_by_reason()
    assert list(counts.items()) == [
        (Reason.FOLDED, 1),
        (Reason.KEPT_BY_BARRIER, 2),
        (Reason.NOT_CONSTANT, 1),
    ]


def test_folded_and_kept_partition_the_decisions():
    plan = mixed_plan()
    assert [d.label for d in plan.folded] == ["e"]
    assert [d.label for d in plan.kept] == ["b", "y", "n"]
    assert plan.folds(0) and not plan.folds(1)


def test_explain_every_reason_once():
    """One line per decision, and the header counts each reason that occurs."""
    g = G(function="f")
    c = g.const("c")
    g.call("relax.exp", c, label="fold_me")
    g.barrier(c, label="bar")
    dq = g.call("relax.dequantize", g.const("ci8", "int8"), label="dq", dtype="float32")
    g.call("relax.exp", g.runtime("x"), label="rt")
    for i, reason in enumerate([Reason.DYNAMIC_SHAPE, Reason.IMPURE, Reason.UNSUPPORTED]):
        g.call("my.op", c, label=f"u{i}", unfoldable=reason, unfoldable_detail=f"why {i}")
    g.call("relax.exp", c, label="bad")
    g.call("relax.matmul", g.runtime("xm"), dq, label="mm")  # dq is a weight
    plan = plan_folds(g.build(), KEEP_QDQ_WEIGHTS_POLICY, eval_failures={7: "ValueError: nope"})
    lines = plan.explain().splitlines()
    assert lines[0] == (
        "fold plan under policy 'keep-qdq-weights': 1 folded, 1 kept by barrier, 1 kept by policy, "
        "2 not constant, 1 dynamic shape, 1 impure, 1 unsupported, 1 evaluation failed"
    )
    assert len(lines) == 1 + len(plan.decisions)
    assert all(line.startswith("  f: ") for line in lines[1:])
    assert (
        "  f: dq = relax.dequantize: kept by policy [keep-dequantize-of-integer-constant]: "
        in lines[3]
    )
    assert lines[5] == "  f: u0 = my.op: dynamic shape: why 0"
    assert lines[8] == "  f: bad = relax.exp: evaluation failed: ValueError: nope"


def test_explain_empty_plan():
    plan = plan_folds(FoldGraph(()), DEFAULT_POLICY)
    assert plan.explain() == "fold plan under policy 'default': no calls"


@pytest.mark.parametrize(
    "decision,text",
    [
        (FoldDecision(0, "v", "relax.exp", Action.FOLD, Reason.FOLDED), "v = relax.exp: folded"),
        (
            FoldDecision(0, "v", "relax.exp", Action.FOLD, Reason.FOLDED, "r"),
            "v = relax.exp: folded [r]",
        ),
        (
            FoldDecision(0, "v", "relax.exp", Action.KEEP, Reason.IMPURE, "", "d"),
            "v = relax.exp: impure: d",
        ),
        (
            FoldDecision(0, "v", "op", Action.KEEP, Reason.KEPT_BY_POLICY, "r", "d"),
            "v = op: kept by policy [r]: d",
        ),
    ],
)
def test_decision_str(decision, text):
    assert str(decision) == text


def test_report_explain():
    report = FoldReport(
        mixed_plan(),
        constant_bytes=(1024, 16),
        kernels_compiled=3,
        seconds={"walk": 0.0123, "plan": 0.002, "compile": 0.5},
    )
    assert report.total_seconds == pytest.approx(0.5143)
    lines = report.explain().splitlines()
    assert lines[: len(EXPECTED_LINES)] == EXPECTED_LINES
    assert lines[len(EXPECTED_LINES) :] == [
        "constants: 1024 bytes before, 16 bytes after",
        "kernels compiled: 3; time: 514 ms (walk 12 ms, plan 2 ms, compile 500 ms)",
    ]
    brief = report.explain(verbose=False).splitlines()
    assert brief == [EXPECTED_LINES[0]] + lines[len(EXPECTED_LINES) :]


def test_report_defaults():
    report = FoldReport(plan_folds(FoldGraph(()), DEFAULT_POLICY))
    assert report.total_seconds == 0
    assert "constants: 0 bytes before, 0 bytes after" in report.explain()


def test_planner_logs_decisions_and_summary(caplog):
    with caplog.at_level(logging.DEBUG, logger="fold_guard"):
        plan = mixed_plan()
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert debug == [f"main/{d.label}: {d}" for d in plan.decisions]
    assert info == [EXPECTED_LINES[0]]
    # Lazy %-formatting: the record keeps the template and its arguments.
    assert all("%s" in r.msg for r in caplog.records)


def test_report_counts_constant_bytes_once_when_first_read():
    counted = []

    def count():
        counted.append(True)
        return (1024, 16)

    report = FoldReport(mixed_plan(), constant_bytes=count)
    assert counted == []  # a pass nobody asks for its report never counts
    assert (report.constant_bytes_before, report.constant_bytes_after) == (1024, 16)
    assert "constants: 1024 bytes before, 16 bytes after" in report.explain()
    assert counted == [True]
