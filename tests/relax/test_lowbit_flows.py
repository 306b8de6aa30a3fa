"""Low-bit weights whose dequantize is a kernel: TVM's CUTLASS-style flow and MLC-LLM's q4f16_1 block.

Weights as parameters (issue 32, item 4), the flow of TVM's ``test_codegen_cutlass.py``
(``test_fp16A_int8B_gemm``, ``test_fp16A_int4B_gemm``), which writes the stops by hand::

    main(x, w: f16)  e = call_tir(encode, (w,)); d = call_tir(decode, (e[0], e[1])); matmul(x, d)
      stock LiftTransformParams       ==>  transform: encode, decode      main(x, d: f16)
      annotate(keep-qdq-weights)
        + LiftTransformParams         ==>  transform: encode              main(x, q: i8, s: f16)
                                                                            decode(q, s) -> matmul

Weights as constants (item 5's block, reduced): stock ``FoldConstant`` evaluates every
``call_tir(dequantize, (<uint32>, <f16>))``; ``fold(policy="keep-qdq-weights")`` keeps them all.
Every module is also built and run on the CPU: the outputs are bit-identical to the unfolded,
unannotated module's.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List, Sequence

import numpy as np
import pytest
import tvm
import tvm_ffi
from _common import lowbit_llm
from tvm import relax

import fold_guard.relax as fgr

KEEP = "keep-qdq-weights"
BITS = [pytest.param(8, id="int8"), pytest.param(4, id="int4x2")]
LAZY = tvm.ir.transform.Sequential(
    # The order LazyTransformParams needs on 0.27 (bench/README.md): without its dataflow block.
    [
        relax.transform.ToNonDataflow(),
        relax.transform.RemovePurityChecking(),
        relax.transform.LazyTransformParams(),
    ]
)


# ----------------------------------------------------------------------------------- helpers


#: TVM's own form (one ``encode`` kernel of two results, read through tuple items) and one
#: kernel per encoded result (``encode``, ``encode_scale``).
FORMS = [pytest.param(False, id="tuple-encode"), pytest.param(True, id="split-encode")]


def _module(bits: int, split: bool = False, **shape) -> tvm.IRModule:
    """The CUTLASS-style module (``split``: one encode kernel per encoded result)."""
    return lowbit_llm.build_cutlass_style_module(bits=bits, split_encode=split, **shape)


def _encoders(split: bool) -> List[str]:
    return ["encode", "encode_scale"] if split else ["encode"]


def _kernels(func: relax.Function) -> List[str]:
    """The PrimFuncs ``func`` calls through ``call_tir``, in order."""
    names: List[str] = []

    def visit(expr: relax.Expr) -> None:
        if (
            isinstance(expr, relax.Call)
            and isinstance(expr.op, tvm.ir.Op)
            and expr.op.name == "relax.call_tir"
        ):
            names.append(str(expr.args[0].name_hint))

    relax.analysis.post_order_visit(func, visit)
    return names


def _param_dtypes(func: relax.Function) -> List[str]:
    return [str(p.ty.dtype) for p in func.params]


def _vm(mod: tvm.IRModule) -> relax.VirtualMachine:
    return relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())


def _inputs(k: int, n: int, tokens: int = 4) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "x": rng.uniform(-1, 1, (tokens, k)).astype("float16"),
        "w": (rng.standard_normal((k, n)) / np.sqrt(k)).astype("float16"),
    }


def _run_unlifted(mod: tvm.IRModule, data: Dict[str, np.ndarray]) -> np.ndarray:
    return _vm(mod)["main"](tvm.runtime.tensor(data["x"]), tvm.runtime.tensor(data["w"])).numpy()


def _run_lifted(mod: tvm.IRModule, data: Dict[str, np.ndarray]):
    vm = _vm(mod)
    transformed = vm["main_transform_params"]([tvm.runtime.tensor(data["w"])])
    out = vm["main"](tvm.runtime.tensor(data["x"]), *transformed)
    return out.numpy(), [t.numpy() for t in transformed]


@contextlib.contextmanager
def _global_funcs(**funcs) -> Iterator[None]:
    """Register packed functions (a lazy transform's ``get_item`` / ``set_item``) for a block."""
    previous = {name: tvm.get_global_func(name, allow_missing=True) for name in funcs}
    for name, func in funcs.items():
        tvm.register_global_func(name, func, override=True)
    try:
        yield
    finally:
        for name, func in previous.items():
            if func is not None:
                tvm.register_global_func(name, func, override=True)
            else:
                tvm_ffi.remove_global_func(name)


def _decode_matmul_composites(mod: tvm.IRModule) -> List[str]:
    """The functions TVM's own ``cutlass.decode_matmul*`` patterns make of ``mod`` (no CUDA needed
    to match: the table and its check are Python)."""
    import tvm.relax.backend.cuda.cutlass  # noqa: F401  (registers the CUTLASS patterns)
    from tvm.relax.backend.pattern_registry import get_patterns_with_prefix

    patterns = get_patterns_with_prefix("cutlass.decode_matmul")
    fused = relax.transform.FuseOpsByPattern(patterns, annotate_codegen=False)(mod)
    return sorted(
        str(func.attrs["Composite"])
        for func in fused.functions.values()
        if isinstance(func, relax.Function) and func.attrs and "Composite" in func.attrs
    )


# ----------------------------------------------------------------------------------- item 4


@pytest.mark.stock
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("split", FORMS)
def test_stock_lifting_moves_the_decode_into_the_transform(bits, split):
    """The contrast: without stops, ``main`` receives the decoded float16 weight."""
    module = lowbit_llm.build_cutlass_style_module(bits=bits, split_encode=split)
    lifted = relax.transform.LiftTransformParams()(module)
    assert _kernels(lifted["main_transform_params"])[-1] == "decode"
    assert _kernels(lifted["main"]) == []
    assert _param_dtypes(lifted["main"]) == ["float16", "float16"]


@pytest.mark.parametrize("split", FORMS)
@pytest.mark.parametrize("bits", BITS)
def test_annotate_then_lift_keeps_the_decode_in_main_as_the_hand_placed_stops_do(bits, split):
    """The decode reads the encode's results through tuple items in TVM's form: they are lifted
    with the encode, so the decode is on the parameter path and the policy keeps it."""
    mod = _module(bits, split)
    plan = fgr.plan(mod, policy=KEEP)
    decode = next(d for d in plan.decisions if d.label == "w_decoded")
    assert (decode.action.value, decode.rule) == ("keep", "keep-dequantize-of-integer-constant")
    lifted = relax.transform.LiftTransformParams()(fgr.annotate(mod, policy=KEEP).mod)
    # TVM's test writes stop_lift_params on the decode's operands by hand: the same placement.
    by_hand = relax.transform.LiftTransformParams()(
        lowbit_llm.build_cutlass_style_module(bits=bits, hand_stops=True, split_encode=split)
    )
    for lifted_mod in (lifted, by_hand):
        assert _kernels(lifted_mod["main_transform_params"]) == _encoders(split)
        assert _kernels(lifted_mod["main"]) == ["decode"]
        # main reads the encoded weight (int8, or two int4 in an int8) and its float16 scales
        assert _param_dtypes(lifted_mod["main"]) == ["float16", "int8", "float16"]
    tvm.ir.assert_structural_equal(mod, _module(bits, split))  # untouched


def test_tuple_items_of_a_folded_encode_stay_run_time_inputs_as_in_stock():
    """Weights bound as constants: the encode folds to a tuple of constants, and as in the stock
    pass its items are not constants, so the decode does not fold (guarantee 1)."""
    mod = _module(8, False, k=8, n=8)
    w = np.random.default_rng(0).standard_normal((8, 8)).astype("float16")
    bound = relax.transform.BindParams("main", {"w": tvm.runtime.tensor(w)})(mod)
    stock = relax.transform.FoldConstant()(bound)
    tvm.ir.assert_structural_equal(fgr.FoldConstant()(bound), stock)
    assert _kernels(stock["main"]) == ["decode"]


@pytest.mark.parametrize("split", FORMS)
@pytest.mark.parametrize("bits", BITS)
def test_tvm_cutlass_decode_matmul_pattern_matches_main_only_after_annotate(bits, split):
    mod = _module(bits, split)
    stock = relax.transform.LiftTransformParams()(mod)
    ours = relax.transform.LiftTransformParams()(fgr.annotate(mod, policy=KEEP).mod)
    assert _decode_matmul_composites(stock) == []
    # A pattern table wants no barrier in the way: release them (fgr.partition does the same).
    assert _decode_matmul_composites(fgr.ReleaseBarriers()(ours)) == ["cutlass.decode_matmul"]


@pytest.mark.slow
@pytest.mark.parametrize("split", FORMS)
@pytest.mark.parametrize("bits", BITS)
def test_lifted_module_runs_bit_for_bit_as_the_unannotated_one(bits, split):
    k, n = 64, 96
    mod = _module(bits, split, k=k, n=n)
    data = _inputs(k, n)
    expected = _run_unlifted(mod, data)
    ours, (packed, scale) = _run_lifted(
        relax.transform.LiftTransformParams()(fgr.annotate(mod, policy=KEEP).mod), data
    )
    stock, _ = _run_lifted(relax.transform.LiftTransformParams()(mod), data)
    np.testing.assert_array_equal(ours, expected)
    np.testing.assert_array_equal(stock, expected)
    # what main received is the encoded weight, and it decodes to the NumPy reference's weight
    assert (packed.dtype, packed.shape, scale.dtype) == (np.int8, (k * bits // 8, n), np.float16)
    reference = lowbit_llm.decode_int8(packed, scale, bits).astype(np.float32)
    np.testing.assert_allclose(reference, data["w"].astype(np.float32), atol=float(scale.max()))
    # the annotated module also builds and runs without lifting (the stop lowers to identity)
    np.testing.assert_array_equal(_run_unlifted(fgr.annotate(mod, policy=KEEP).mod, data), expected)


@pytest.mark.slow
@pytest.mark.parametrize("split", FORMS)
@pytest.mark.parametrize("bits", BITS)
def test_lazy_transform_params_keeps_the_decode_in_main_and_loads_the_same_weights(bits, split):
    k, n = 64, 96
    mod = _module(bits, split, k=k, n=n)
    data = _inputs(k, n)
    lifted = relax.transform.LiftTransformParams()(fgr.annotate(mod, policy=KEEP).mod)
    lazy = LAZY(lifted)
    assert _kernels(lazy["main"]) == ["decode"]
    assert set(_encoders(split)) <= set(_kernels(lazy["main_transform_params"]))
    assert "decode" not in _kernels(lazy["main_transform_params"])

    written: Dict[int, np.ndarray] = {}

    def get_item(index: int):
        return tvm.runtime.tensor(data["w"])

    def set_item(index: int, value) -> None:
        written[int(index)] = value.numpy()

    with _global_funcs(get_item=get_item, set_item=set_item):
        _vm(lazy)["main_transform_params"]()
    _, eager = _run_lifted(lifted, data)
    assert sorted(written) == [0, 1]
    for index, value in enumerate(eager):
        np.testing.assert_array_equal(written[index], value)
    # (a VM of the lazy module resolves get_item when it loads: run its main inside the scope too)
    with _global_funcs(get_item=get_item, set_item=set_item):
        out = _vm(lazy)["main"](*[tvm.runtime.tensor(a) for a in (data["x"], *written.values())])
    np.testing.assert_array_equal(out.numpy(), _run_unlifted(mod, data))


@pytest.mark.parametrize("split", FORMS)
def test_default_policy_writes_nothing_into_the_cutlass_style_module(split):
    """Guarantee 1 on this flow: ``default`` changes nothing, so stock lifting is unchanged."""
    mod = _module(8, split)
    annotated = fgr.annotate(mod, policy="default").mod
    tvm.ir.assert_structural_equal(annotated, mod)


# ----------------------------------------------------------------------------------- item 5's block


@pytest.fixture(scope="module")
def block() -> tvm.IRModule:
    return lowbit_llm.build_decoder_block(hidden=64, intermediate=128, heads=2, tokens=2)


def _deq_weight_dtypes(mod: tvm.IRModule) -> Sequence[str]:
    return [str(c.args[1].fields[0].ty.dtype) for c in lowbit_llm.dequantize_calls(mod)]


def test_keep_qdq_weights_keeps_every_dequantize_kernel_with_its_packed_constant(block):
    imported = lowbit_llm.constant_bytes(block)
    result = fgr.fold(block, policy=KEEP)
    assert _deq_weight_dtypes(result.mod) == ["uint32"] * 7
    assert lowbit_llm.constant_bytes(result.mod) <= imported
    assert result.report.constant_bytes_after <= result.report.constant_bytes_before


@pytest.mark.slow
def test_stock_and_default_fold_every_dequantize_kernel_and_grow_the_constants(block):
    stock = relax.transform.FoldConstant()(block)
    assert lowbit_llm.dequantize_calls(stock) == []
    assert lowbit_llm.constant_bytes(stock) > 3 * lowbit_llm.constant_bytes(block)
    tvm.ir.assert_structural_equal(fgr.fold(block, policy="default").mod, stock)


@pytest.mark.slow
def test_the_folded_block_runs_bit_for_bit_as_the_unfolded_one(block):
    inputs = [tvm.runtime.tensor(a) for a in lowbit_llm.block_inputs(block)]
    expected = _vm(block)["main"](*inputs).numpy()
    assert np.isfinite(expected.astype(np.float32)).all()
    for folded in (fgr.fold(block, policy=KEEP).mod, relax.transform.FoldConstant()(block)):
        np.testing.assert_array_equal(_vm(folded)["main"](*inputs).numpy(), expected)


def test_the_dequantize_kernel_computes_the_q4f16_1_reference():
    """The TE kernel and the NumPy reference agree bit for bit (int4 in uint32, zero point 7)."""
    weight = np.random.default_rng(3).standard_normal((16, 96)).astype("float16")
    packed, scale = lowbit_llm.quantize_q4f16_1(weight)
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        with bb.dataflow():
            out = bb.emit_output(
                bb.call_te(
                    lowbit_llm.dequantize_q4f16_1_te,
                    relax.const(packed),
                    relax.const(scale),
                    primfunc_name_hint="dequantize",
                )
            )
        bb.emit_func_output(out)
    got = _vm(bb.get())["main"]().numpy()
    np.testing.assert_array_equal(got, lowbit_llm.dequantize_q4f16_1(packed, scale))
    # within half a step of the weight, per group
    step = np.repeat(scale.astype(np.float32), lowbit_llm.GROUP_SIZE, axis=1)
    assert (np.abs(got.astype(np.float32) - weight) <= step / 2 + 1e-2).all()
