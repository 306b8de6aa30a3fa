"""The cast of a float16 / bfloat16 weight stays under keep-low-precision-weights and the QDQ policies.

TFLite's float16 models (and hand-written half-precision modules) carry weights as
``astype(<float16 constant>, "float32")``. Folded, the backend receives a float32 copy at twice
the bytes; kept, it receives the float16 constant and the cast.

White-box on purpose: it tests the TVM-free core (``fold_guard._core``) directly, below the
adapters' public entry points.
"""

from __future__ import annotations

import pytest
from graphdsl import G, summary

from fold_guard._core import plan_folds, resolve_policy

KEEPING = ("keep-low-precision-weights", "keep-qdq-weights", "qdq-accelerator")
FOLDING = ("default", "weights-only", "size-guard", "fold-qnn")
RULE = "keep-low-precision-weight-cast"
CAST = {"relax": "relax.astype", "relay": "cast"}
CONV = {"relax": "relax.nn.conv2d", "relay": "nn.conv2d"}
ADD = {"relax": "relax.add", "relay": "add"}


def weight_graph(ir: str, source: str, target: str = "float32"):
    """
    w = cast(W: source) -> target     the weight, through a reshape
    r = reshape(w)
    y = conv2d(x, r)
    c = cast(B: source) -> target     the bias, added to the conv's output
    z = add(y, c)
    """
    g = G()
    w = g.call(CAST[ir], g.const("W", source, (4, 4)), label="w", dtype=target)
    r = g.call(f"{ir}.reshape" if ir == "relax" else "reshape", w, label="r")
    y = g.call(CONV[ir], g.runtime("x", target, (4, 4)), r, label="y")
    c = g.call(CAST[ir], g.const("B", source, (4,)), label="c", dtype=target)
    g.call(ADD[ir], y, c, label="z")
    return g.build()


@pytest.mark.parametrize("ir", ["relax", "relay"])
@pytest.mark.parametrize("source", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", KEEPING)
def test_the_cast_of_a_low_precision_weight_and_bias_stays(ir, source, name):
    plan = plan_folds(weight_graph(ir, source), resolve_policy(name))
    assert summary(plan) == {
        "w": f"KEPT_BY_POLICY {RULE}",
        "r": f"KEPT_WITH_INPUT {RULE}",
        "y": "NOT_CONSTANT",
        "c": f"KEPT_BY_POLICY {RULE}",
        "z": "NOT_CONSTANT",
    }


@pytest.mark.parametrize("ir", ["relax", "relay"])
@pytest.mark.parametrize("name", FOLDING)
def test_other_policies_fold_it_to_float32(ir, name):
    summary_ = summary(plan_folds(weight_graph(ir, "float16"), resolve_policy(name)))
    assert summary_["w"] == summary_["c"] == "FOLDED default"


@pytest.mark.parametrize(
    "source, target", [("float32", "float16"), ("int8", "float32"), ("float16", "int32")]
)
def test_other_casts_are_not_low_precision_weights(source, target):
    """Narrowing a float32 weight, widening an integer or casting a half to integers: no opinion."""
    summary_ = summary(
        plan_folds(
            weight_graph("relax", source, target), resolve_policy("keep-low-precision-weights")
        )
    )
    assert summary_["w"] == "FOLDED default"


def test_a_half_constant_that_is_no_weight_folds():
    """``add(x, astype(<float16 C>))`` adds a constant to an activation: not a weight, folds."""
    g = G()
    c = g.call("relax.astype", g.const("C", "float16", (4,)), label="c", dtype="float32")
    g.call("relax.add", g.runtime("x", "float32", (4,)), c, label="z")
    assert (
        summary(plan_folds(g.build(), resolve_policy("keep-qdq-weights")))["c"] == "FOLDED default"
    )


def test_a_cast_to_float64_is_kept_too():
    plan = plan_folds(
        weight_graph("relax", "float16", "float64"), resolve_policy("keep-qdq-weights")
    )
    assert summary(plan)["w"] == f"KEPT_BY_POLICY {RULE}"
