"""The grouped report (fold_guard._core.summary): counts, rules with their consequences, layers.

w = dequantize(c_i8) [kept by rule]; r = reshape(w) [kept: input kept]; y = matmul(x, r)
q = quantize(c_f32) [folded]

White-box on purpose: it tests the TVM-free core (``fold_guard._core``) directly, below the
adapters' public entry points.
"""

from __future__ import annotations

from graphdsl import G

from fold_guard._core.builtin_policies import KEEP_QDQ_WEIGHTS_POLICY
from fold_guard._core.planner import plan_folds
from fold_guard._core.report import FoldReport
from fold_guard._core.summary import SCHEMA_VERSION, format_summary, summarize

KEEP_DQ_RULE = "keep-dequantize-of-integer-constant"


def _plan():
    g = G()
    x = g.runtime("input")
    w = g.call(
        "relax.dequantize",
        g.const("c_i8", "int8", shape=(8, 4)),
        label="w",
        dtype="float32",
        shape=(8, 4),
    )
    r = g.call("relax.reshape", w, label="r", dtype="float32", shape=(32,))
    g.call("relax.matmul", x, r, label="y", dtype="float32", shape=(32,))
    g.call("relax.quantize", g.const("c_f32", shape=(16,)), label="q", dtype="int8", shape=(16,))
    return plan_folds(g.build(), KEEP_QDQ_WEIGHTS_POLICY)


def test_counts_and_rules_separate_own_verdicts_from_consequences():
    summary = summarize(_plan(), layers={("main", "w"): "conv0.weight", ("main", "r"): "conv0"})
    assert summary["version"] == SCHEMA_VERSION
    assert summary["counts"]["by_action"] == {"fold": 1, "keep": 3, "lift": 0}
    assert summary["counts"]["by_reason"] == {
        "folded": 1,
        "kept_by_policy": 1,
        "kept_with_input": 1,
        "not_constant": 1,
    }
    rules = {rule["rule"]: rule for rule in summary["rules"]}
    assert rules[KEEP_DQ_RULE] == {
        "rule": KEEP_DQ_RULE,
        "folded": 0,
        "kept": 1,
        "lifted": 0,
        "kept_with_input": 1,
        "calls": ["conv0.weight"],
    }
    assert rules["fold-quantize-of-constant"]["folded"] == 1
    assert [fold["label"] for fold in summary["largest_folds"]] == ["q"]
    assert summary["largest_folds"][0]["nbytes"] == 16
    records = {record["label"]: record for record in summary["decisions"]}
    assert records["r"]["root"] == records["w"]["id"] and records["r"]["layer"] == "conv0"
    assert records["y"]["inputs"][0] == {
        "kind": "runtime",
        "label": "input",
        "node": None,
        "tensor": {"dtype": "float32", "shape": [4], "nbytes": 16},
    }


def test_summary_text_is_grouped_and_verbose_adds_every_call():
    plan = _plan()
    layers = {("main", "w"): "conv0.weight"}
    brief = format_summary(plan, summarize(plan, layers=layers)).splitlines()
    assert brief[0] == "policy 'keep-qdq-weights': 4 calls: 1 folded, 2 kept, 1 not constant"
    assert (
        brief[1]
        == "  by reason: 1 folded, 1 kept by policy, 1 kept because an input was kept, 1 not constant"
    )
    assert f"  {KEEP_DQ_RULE}: kept 1 (+1 kept because an input was): conv0.weight" in brief
    assert not any(line.startswith("  main/") for line in brief)
    verbose = format_summary(plan, summarize(plan, layers=layers), verbose=True).splitlines()
    assert verbose[len(brief)] == "decisions:"
    assert (
        "  main/w [conv0.weight] = relax.dequantize -> float32[8, 4]: kept by policy"
        in verbose[len(brief) + 1]
    )
    assert (
        verbose[-2]
        == "  main/y = relax.matmul -> float32[32]: not constant: 'input' is a run-time input"
    )


def test_report_summary_adds_bytes_and_times():
    report = FoldReport(_plan(), constant_bytes=(100, 40), seconds={"plan": 0.002})
    assert report.to_dict()["constant_bytes"] == {"before": 100, "after": 40}
    text = report.summary()
    assert "constants: 100 B before, 40 B after" in text and "time: 2 ms (plan 2 ms)" in text
