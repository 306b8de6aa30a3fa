"""Built-in policies, composition and the named-policy registry.

White-box on purpose: it tests the TVM-free core (``fold_guard._core``) directly, below the
adapters' public entry points.
"""

import math

import pytest
from graphdsl import G, summary

import fold_guard
from fold_guard._core import (
    DEFAULT_GROWTH_FACTOR,
    DEFAULT_MIN_RESULT_BYTES,
    DEFAULT_POLICY,
    DEQUANTIZE_OPS,
    FOLD_QNN_POLICY,
    KEEP_QDQ_WEIGHTS_POLICY,
    QDQ_ACCELERATOR_POLICY,
    QUANTIZE_OPS,
    SIZE_GUARD_POLICY,
    Action,
    CallView,
    FoldPolicy,
    PreconditionError,
    Reason,
    Rule,
    TensorInfo,
    UnknownPolicyError,
    compose,
    get_policy,
    list_policies,
    memory_budget,
    plan_folds,
    policy_registry_scope,
    register_policy,
    resolve_policy,
    size_guard,
    unregister_policy,
)

BUILTIN_NAMES = [
    "default",
    "fold-qnn",
    "keep-low-precision-weights",
    "keep-qdq-weights",
    "keep-requantize",
    "qdq-accelerator",
    "size-guard",
    "weights-only",
]


@pytest.fixture(autouse=True)
def _registry_scope():
    """Every test here runs inside a registry scope, so none can leak a registration."""
    with policy_registry_scope():
        yield


def single_call(op, *inputs, outputs=None, function="main", consumer=None):
    """A CallView of ``op(*inputs)`` where each input is (dtype, shape) of a literal constant;
    ``consumer`` names an op that reads its result with a run-time value (``y = consumer(x, v)``)."""
    g = G(function)
    refs = [g.const(f"c{i}", dtype, shape) for i, (dtype, shape) in enumerate(inputs)]
    v = g.call(op, *refs, label="v", outputs=outputs)
    if consumer is not None:
        g.call(consumer, g.runtime("x", "float32", (16, 16)), v, label="y")
    graph = g.build()
    return CallView(graph.nodes[0], graph)


def fold_ops(*ops, name="fold-ops"):
    return FoldPolicy(name, f"fold {ops}", (Rule(name, Action.FOLD, "", lambda c: c.op in ops),))


def keep_ops(*ops, name="keep-ops"):
    return FoldPolicy(name, f"keep {ops}", (Rule(name, Action.KEEP, "", lambda c: c.op in ops),))


# Built-ins by name -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_builtins_are_registered(name):
    policy = get_policy(name)
    assert policy.name == name
    assert policy is resolve_policy(name)
    assert policy is fold_guard.get_policy(name)


def test_builtin_objects():
    assert get_policy("default") is DEFAULT_POLICY
    assert get_policy("fold-qnn") is FOLD_QNN_POLICY
    assert get_policy("keep-qdq-weights") is KEEP_QDQ_WEIGHTS_POLICY
    assert get_policy("size-guard") is SIZE_GUARD_POLICY


def test_default_policy_has_no_opinion():
    """``default`` is exactly the IR's default: no rules, so the node's ``default_fold`` decides."""
    assert DEFAULT_POLICY.rules == ()
    assert DEFAULT_POLICY.decide(single_call("relax.dequantize", ("int8", (4,)))) is None
    assert "no rules" in DEFAULT_POLICY.describe()


# fold-qnn --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "op", ["qnn.quantize", "qnn.dequantize", "qnn.requantize", "qnn.conv2d", "qnn.dense"]
)
def test_fold_qnn_folds_every_qnn_op(op):
    call = single_call(op, ("int8", (16,)), outputs=[TensorInfo.of("int8", (16,))])
    action, rule = FOLD_QNN_POLICY.decide(call)
    assert action is Action.FOLD and rule.name == "fold-qnn-ops"


@pytest.mark.parametrize("op", ["add", "nn.conv2d", "relax.quantize", "qnnx.custom"])
def test_fold_qnn_has_no_opinion_on_other_ops(op):
    """Outside QNN the IR default decides, so fold-qnn equals default there (and on Relax)."""
    assert FOLD_QNN_POLICY.decide(single_call(op, ("float32", (16,)))) is None


# keep-qdq-weights ------------------------------------------------------------------------------


@pytest.mark.parametrize("op", sorted(DEQUANTIZE_OPS))
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32"])
def test_keep_qdq_keeps_dequantize_of_integer_constant(op, dtype):
    weight_op = "relax.matmul" if op.startswith("relax") else "nn.dense"
    call = single_call(
        op,
        (dtype, (16,)),
        ("float32", ()),
        (dtype, ()),
        outputs=[TensorInfo.of("float32", (16,))],
        consumer=weight_op,
    )
    action, rule = KEEP_QDQ_WEIGHTS_POLICY.decide(call)
    assert action is Action.KEEP and rule.name == "keep-dequantize-of-integer-constant"


@pytest.mark.parametrize("policy", [KEEP_QDQ_WEIGHTS_POLICY, QDQ_ACCELERATOR_POLICY])
@pytest.mark.parametrize("consumer", ["relax.take", "relax.add", None])
def test_the_qdq_policies_keep_only_a_weights_dequantize(policy, consumer):
    """An embedding table's ``dequantize`` read by ``take``, one added to an activation, one
    returned: no weight, so no rule keeps it and the default decides (Relax: it folds)."""
    call = single_call(
        "relax.dequantize",
        ("int8", (16, 16)),
        ("float32", ()),
        ("int8", ()),
        outputs=[TensorInfo.of("float32", (16, 16))],
        consumer=consumer,
    )
    assert policy.decide(call) is None


@pytest.mark.parametrize("op", sorted(QUANTIZE_OPS))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_keep_qdq_folds_quantize(op, dtype):
    call = single_call(
        op, (dtype, (16,)), ("float32", ()), ("int8", ()), outputs=[TensorInfo.of("int8", (16,))]
    )
    action, rule = KEEP_QDQ_WEIGHTS_POLICY.decide(call)
    assert action is Action.FOLD and rule.name == "fold-quantize-of-constant"


@pytest.mark.parametrize(
    "op,dtype",
    [
        (
            "relax.dequantize",
            "float32",
        ),  # float dequantize (e.g. fp8 emulation) is not a QDQ weight
        ("qnn.dequantize", "float16"),
        ("relax.add", "int8"),
        ("relax.astype", "int8"),
        ("relax.nn.conv2d", "int8"),
        ("my.dequantize", "int8"),  # only the two known dequantize ops
    ],
)
def test_keep_qdq_has_no_opinion_on_others(op, dtype):
    call = single_call(op, (dtype, (16,)))
    assert KEEP_QDQ_WEIGHTS_POLICY.decide(call) is None


def test_keep_qdq_dequantize_without_tensor_info_has_no_opinion():
    g = G()
    g.call("relax.dequantize", label="d")  # no inputs at all
    graph = g.build()
    assert KEEP_QDQ_WEIGHTS_POLICY.decide(CallView(graph.nodes[0], graph)) is None


def test_keep_qdq_on_a_weight_qdq_chain():
    """
    q = quantize(w_f32); d = dequantize(q); y = conv2d(x, d)
        ==>   q = C (int8); d = dequantize(C) stays; y stays
    """
    g = G()
    q = g.call("relax.quantize", g.const("w"), label="q", dtype="int8")
    d = g.call("relax.dequantize", q, label="d", dtype="float32")
    g.call("relax.nn.conv2d", g.runtime("x"), d, label="y")
    plan = plan_folds(g.build(), resolve_policy("keep-qdq-weights"))
    assert summary(plan) == {
        "q": "FOLDED fold-quantize-of-constant",
        "d": "KEPT_BY_POLICY keep-dequantize-of-integer-constant",
        "y": "NOT_CONSTANT",
    }


# size-guard ------------------------------------------------------------------------------------


def f32(*shape):
    return ("float32", shape)


@pytest.mark.parametrize(
    "inputs,out_shape,kept",
    [
        # 1024 input bytes, factor 4: a 4096-byte result is at the limit -> kept (at least 4x:
        # a dequantize of int8 to float32 is exactly 4x its weight)
        pytest.param([f32(256)], (1024,), True, id="exactly-factor"),
        pytest.param([f32(512)], (2047,), False, id="just-below-factor"),
        pytest.param([f32(256)], (64, 64), True, id="well-above-factor"),
        # the largest input counts, not their sum (a dequantize's scales make it no smaller)
        pytest.param([f32(64), f32(512)], (2048,), True, id="largest-input-exactly"),
        pytest.param([f32(64), f32(512)], (2047,), False, id="largest-input-below"),
        # below min_result_bytes never kept, however large the growth
        pytest.param([f32()], (1023,), False, id="below-min-bytes"),
        pytest.param([f32()], (1024,), True, id="at-min-bytes"),
        # creation ops: no inputs at all
        pytest.param([], (32, 32), True, id="creation-at-min-bytes"),
        pytest.param([], (31, 32), False, id="creation-below-min-bytes"),
        # an unknown result size is never kept for size
        pytest.param([f32()], (None, 4096), False, id="dynamic-result"),
        # a shrinking call is never kept
        pytest.param([f32(8192)], (2048,), False, id="shrinks"),
    ],
)
def test_size_guard_thresholds(inputs, out_shape, kept):
    call = single_call("relax.broadcast_to", *inputs, outputs=[TensorInfo.of("float32", out_shape)])
    verdict = SIZE_GUARD_POLICY.decide(call)
    if kept:
        assert verdict is not None
        action, rule = verdict
        assert action is Action.KEEP and rule.name == "size-guard"
    else:
        assert verdict is None


def test_size_guard_defaults():
    assert DEFAULT_GROWTH_FACTOR == 4.0 and DEFAULT_MIN_RESULT_BYTES == 4096
    assert (
        "4096" in SIZE_GUARD_POLICY.rules[0].description
        and "4x" in SIZE_GUARD_POLICY.rules[0].description
    )


@pytest.mark.parametrize(
    "factor,min_bytes,inputs,out_shape,kept",
    [
        (1.0, 0, [f32(4)], (3,), False),  # smaller than its input at factor 1: not kept
        (1.0, 0, [f32(4)], (4,), True),  # at least 1x
        (2.5, 0, [f32(4)], (9,), False),  # 36 bytes < 2.5 * 16
        (2.5, 0, [f32(4)], (10,), True),  # 40 bytes == 2.5 * 16
        (0.5, 0, [f32(4)], (3,), True),  # factor < 1 keeps shrinking folds too
        (4.0, 0, [], (1,), True),  # min 0: any creation op with a known size
        (4.0, 0, [], (0,), False),  # ... but not an empty result (it costs nothing)
    ],
)
def test_size_guard_custom(factor, min_bytes, inputs, out_shape, kept):
    guard = size_guard(factor, min_result_bytes=min_bytes)
    call = single_call("relax.tile", *inputs, outputs=[TensorInfo.of("float32", out_shape)])
    assert (guard.decide(call) is not None) is kept


def test_size_guard_sums_multiple_outputs():
    outputs = [TensorInfo.of("float32", (512,)), TensorInfo.of("float32", (513,))]  # 4100 bytes
    call = single_call("relax.split", f32(256), outputs=outputs)
    assert call.result_nbytes == 4100
    assert SIZE_GUARD_POLICY.decide(call) is not None


@pytest.mark.parametrize("factor", [0, -1.0, float("nan"), -math.inf])
def test_size_guard_invalid_factor(factor):
    with pytest.raises(PreconditionError, match="growth_factor"):
        size_guard(factor)


def test_size_guard_invalid_min_bytes():
    with pytest.raises(PreconditionError, match="min_result_bytes"):
        size_guard(2.0, min_result_bytes=-1)


def test_size_guard_options_are_keyword_only():
    with pytest.raises(TypeError):
        size_guard(2.0, 0)  # type: ignore[misc]


def test_size_guard_in_a_plan():
    """
    z = zeros() [64x64 f32]; n = neg(z)   ==>   unchanged (z is a 16 KiB constant from nothing)
    """
    g = G()
    z = g.call("relax.zeros", label="z", dtype="float32", shape=(64, 64))
    g.call("relax.negative", z, label="n")
    plan = plan_folds(g.build(), resolve_policy("size-guard"))
    assert summary(plan) == {"z": "KEPT_BY_POLICY size-guard", "n": "KEPT_WITH_INPUT size-guard"}
    assert plan.decisions[0].reason is Reason.KEPT_BY_POLICY
    assert plan.decisions[1].root == 0


# CallView --------------------------------------------------------------------------------------


def test_call_view():
    g = G()
    c = g.const("c", "int8", (2, 3))
    e = g.call(
        "relax.dequantize",
        c,
        g.runtime("s", "float32", ()),
        label="d",
        dtype="float32",
        attrs={"axis": 1},
    )
    g.call("relax.add", e, e, label="a")
    g.call("relax.negative", e, label="n")
    graph = g.build()
    view = CallView(graph.nodes[0], graph)
    assert view.op == "relax.dequantize"
    assert view.attrs == {"axis": 1}
    assert view.input_dtypes == ("int8", "float32")
    assert view.constant_input_nbytes == 6 + 4
    assert view.result_nbytes == 24
    assert view.consumer_ops == ("relax.add", "relax.add", "relax.negative")
    assert view.input_is_constant_literal(0) and not view.input_is_constant_literal(1)
    assert not view.input_is_constant_literal(5)


# Composition -----------------------------------------------------------------------------------


def test_compose_earlier_wins():
    call = single_call("relax.exp", f32(4))
    assert compose(keep_ops("relax.exp"), fold_ops("relax.exp")).decide(call)[0] is Action.KEEP
    assert compose(fold_ops("relax.exp"), keep_ops("relax.exp")).decide(call)[0] is Action.FOLD


def test_compose_falls_through_to_later_policies():
    call = single_call("relax.exp", f32(4))
    policy = compose(keep_ops("relax.add"), fold_ops("relax.exp"))
    assert policy.decide(call)[1].name == "fold-ops"
    assert compose(keep_ops("relax.add")).decide(call) is None


@pytest.mark.parametrize("tight_first", [True, False], ids=["tight-first", "tight-second"])
def test_compose_keeps_the_tightest_budget(tight_first):
    """Each policy's budget is a limit, never a permission: composing two keeps the smaller.

    e = exp(c)   (16 bytes)   under budgets of 8 and 1024 bytes, either order   ==>   e: over budget
    """
    budgets = (memory_budget(8), memory_budget(1024))
    composed = compose(*(budgets if tight_first else budgets[::-1]))
    assert composed.max_fold_bytes == 8
    g = G()
    g.call("relax.exp", g.const("c"), label="e")
    plan = plan_folds(g.build(), composed)
    assert summary(plan) == {"e": "OVER_BUDGET max_fold_bytes"}


def test_compose_names():
    assert compose(KEEP_QDQ_WEIGHTS_POLICY, SIZE_GUARD_POLICY).name == "keep-qdq-weights+size-guard"
    assert compose(KEEP_QDQ_WEIGHTS_POLICY, SIZE_GUARD_POLICY, name="npu").name == "npu"
    composed = compose(KEEP_QDQ_WEIGHTS_POLICY, SIZE_GUARD_POLICY)
    assert composed.rules == KEEP_QDQ_WEIGHTS_POLICY.rules + SIZE_GUARD_POLICY.rules
    assert (
        composed.description
        == f"{KEEP_QDQ_WEIGHTS_POLICY.description}; then {SIZE_GUARD_POLICY.description}"
    )


def test_compose_needs_a_policy():
    with pytest.raises(PreconditionError, match="at least one policy"):
        compose()


def test_describe_lists_rules():
    text = KEEP_QDQ_WEIGHTS_POLICY.describe()
    assert text.splitlines()[0].startswith("keep-qdq-weights: ")
    assert "  - keep-dequantize-of-integer-constant (keep): " in text
    assert "  - fold-quantize-of-constant (fold): " in text


# Registry --------------------------------------------------------------------------------------


def test_register_get_list():
    mine = keep_ops("npu.op", name="my-npu")
    assert register_policy(mine) is mine
    assert get_policy("my-npu") is mine
    assert [p.name for p in list_policies()] == sorted(BUILTIN_NAMES + ["my-npu"])
    assert fold_guard.list_policies() == list_policies()


def test_list_is_sorted_by_name():
    register_policy(keep_ops(name="aaa"))
    register_policy(keep_ops(name="zzz"))
    names = [p.name for p in list_policies()]
    assert names == sorted(names) and names[0] == "aaa" and names[-1] == "zzz"


def test_register_under_another_name_renames():
    registered = register_policy(SIZE_GUARD_POLICY, name="my-guard")
    assert registered.name == "my-guard" and registered.rules == SIZE_GUARD_POLICY.rules
    assert get_policy("my-guard") is registered
    assert get_policy("size-guard") is SIZE_GUARD_POLICY  # the original is untouched


@pytest.mark.parametrize("name", ["size-guard", "mine"])
def test_duplicate_name_is_an_error_unless_replace(name):
    if name == "mine":
        register_policy(keep_ops(name="mine"))
    new = fold_ops("relax.exp", name=name)
    with pytest.raises(PreconditionError, match=f"{name!r} is already registered.*replace=True"):
        register_policy(new)
    assert get_policy(name) is not new
    assert register_policy(new, replace=True) is new
    assert get_policy(name) is new


def test_register_rejects_non_policies():
    with pytest.raises(PreconditionError, match="expects a FoldPolicy, got str"):
        register_policy("size-guard")  # type: ignore[arg-type]


def test_unknown_name_lists_known_names():
    register_policy(keep_ops(name="my-npu"))
    with pytest.raises(UnknownPolicyError) as info:
        get_policy("my-nup")
    message = str(info.value)
    assert "'my-nup'" in message
    for name in BUILTIN_NAMES + ["my-npu"]:
        assert name in message
    assert "register_policy" in message  # the hint
    assert isinstance(info.value, PreconditionError)


def test_unregister():
    register_policy(keep_ops(name="tmp"))
    unregister_policy("tmp")
    with pytest.raises(UnknownPolicyError):
        get_policy("tmp")
    with pytest.raises(UnknownPolicyError, match="'tmp'"):
        unregister_policy("tmp")


def test_registry_scope_restores_additions_removals_and_replacements():
    before = list_policies()
    with pytest.raises(RuntimeError):
        with policy_registry_scope():
            register_policy(keep_ops(name="tmp"))
            unregister_policy("default")
            register_policy(keep_ops(name="size-guard"), replace=True)
            raise RuntimeError("the scope restores even on error")
    assert list_policies() == before
    assert get_policy("default") is DEFAULT_POLICY
    assert get_policy("size-guard") is SIZE_GUARD_POLICY


def test_registry_scopes_nest():
    with policy_registry_scope():
        register_policy(keep_ops(name="outer"))
        with policy_registry_scope():
            register_policy(keep_ops(name="inner"))
        assert "inner" not in [p.name for p in list_policies()]
        assert get_policy("outer").name == "outer"
    assert "outer" not in [p.name for p in list_policies()]


# resolve_policy --------------------------------------------------------------------------------


def test_resolve_policy_object_is_identity():
    mine = keep_ops(name="unregistered")
    assert resolve_policy(mine) is mine


@pytest.mark.parametrize(
    "spec", [["keep-qdq-weights", "size-guard"], ("keep-qdq-weights", SIZE_GUARD_POLICY)]
)
def test_resolve_policy_sequence_composes_in_order(spec):
    policy = resolve_policy(spec)
    assert policy.name == "keep-qdq-weights+size-guard"
    assert policy.rules == KEEP_QDQ_WEIGHTS_POLICY.rules + SIZE_GUARD_POLICY.rules


def test_resolve_policy_single_item_list():
    assert resolve_policy(["size-guard"]).rules == SIZE_GUARD_POLICY.rules


def test_resolve_policy_uses_the_registry():
    register_policy(keep_ops(name="npu"))
    assert resolve_policy(["npu", "default"]).name == "npu+default"


def test_resolve_unknown_name():
    with pytest.raises(UnknownPolicyError, match="keep-qdq-weights"):
        resolve_policy("no-such-policy")
    with pytest.raises(UnknownPolicyError, match="'nope'"):
        resolve_policy(["default", "nope"])


@pytest.mark.parametrize("spec", [None, 42, [], (), {"name": "default"}, [42], Action.FOLD])
def test_resolve_bad_input(spec):
    with pytest.raises(PreconditionError, match="policy must be a registered name"):
        resolve_policy(spec)


def test_resolve_bad_input_lists_known_names():
    with pytest.raises(PreconditionError) as info:
        resolve_policy(None)
    for name in BUILTIN_NAMES:
        assert name in str(info.value)


def test_allow_root_with_a_tuple_result_is_allowed_through_its_inputs():
    """c -> qnn.quantize (q) -> split (s, two results): fold_allow annotates one tensor, so the
    root under fold-qnn is q, not the tuple-valued s (default folds s once q is constant)."""
    from fold_guard._core import (
        DEFAULT_POLICY,
        FOLD_QNN_POLICY,
        FoldGraph,
        FoldNode,
        InputKind,
        NodeInput,
        TensorInfo,
        plan_folds,
    )
    from fold_guard._core.annotate import allow_roots

    t = TensorInfo.of("int8", (4,))
    half = TensorInfo.of("int8", (2,))
    q = FoldNode(
        0,
        "qnn.quantize",
        "q",
        "main",
        (NodeInput(InputKind.CONSTANT, "c", t),),
        (t,),
        default_fold=False,
    )
    s = FoldNode(1, "split", "s", "main", (NodeInput(InputKind.NODE, "q", t, 0),), (half, half))
    graph = FoldGraph((q, s))
    assert allow_roots(plan_folds(graph, FOLD_QNN_POLICY), plan_folds(graph, DEFAULT_POLICY)) == (
        0,
    )


def test_size_guard_keeps_the_dequantize_of_an_int8_weight():
    """int8 -> float32 is exactly 4x the weight, its per-channel scales aside: caught.

    Against the sum of the inputs (weight + scales + zero points) it stayed just under 4x and
    always folded: a W8A32 Llama's constants grew from 2.44 to 6.04 MiB under ``size-guard``.
    """
    weight, per_channel = ("int8", (64, 64)), ("float32", (64,))
    call = single_call(
        "relax.dequantize",
        weight,
        per_channel,
        ("int8", (64,)),
        outputs=[TensorInfo.of("float32", (64, 64))],
    )
    action, rule = SIZE_GUARD_POLICY.decide(call)
    assert action is Action.KEEP and rule.name == "size-guard"
    to_half = single_call(
        "relax.dequantize",
        weight,
        per_channel,
        ("int8", (64,)),
        outputs=[TensorInfo.of("float16", (64, 64))],
    )
    assert SIZE_GUARD_POLICY.decide(to_half) is None  # 2x: not a blow-up
