"""Default-policy equivalence with stock FoldConstant on Relax modules imported from ONNX.

ONNX exports are full of constant subgraphs (weight transposes, shape arithmetic, Q/DQ of
initializers, BatchNorm parameters...), so they stress the parts of fold_guard that model the
stock pass. Every graph below is built with ``onnx.helper`` from fixed seeds, imported with
``tvm.relax.frontend.onnx.from_onnx(model, keep_params_in_input=False)`` (initializers become
Relax constants) and checked three ways:

1. ``fold_guard.relax.FoldConstant()(mod)`` is structurally equal to
   ``tvm.relax.transform.FoldConstant()(mod)``, and every constant is bit-identical;
2. the original module and our folded module, built with ``tvm.compile(..., "llvm")``, give
   bit-identical outputs on fixed random inputs, and both agree with onnxruntime on the ONNX
   model within a loose tolerance;
3. ``fold_guard.relax.fold(mod, strict=True)`` does not raise.

Every graph here imports in apache-tvm 0.27 (Resize, Einsum, TopK, CumSum included); the graphs
with symbolic dims ("N", "S") also build and run, so they get the numerics check too, on a
concrete batch. Note that the 0.27 frontend already folds many all-constant nodes itself in numpy
(Cast, Abs, Neg, Mul, Transpose, Range, ConstantOfShape of an initializer...), so the graphs route
constants through ops it leaves to Relax where it matters.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
import tvm_ffi
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import fold_guard
import fold_guard.relax as fgr

_CONST_TYPE = getattr(tvm.ir, "GenericConst", None) or relax.Constant

OPSET = 17
FLOAT_RTOL = 1e-4
FLOAT_ATOL = 1e-5

# name -> builder returning (model, feed); a graph with symbolic dims gets a concrete feed.
GRAPHS: dict[str, Callable[[], tuple[onnx.ModelProto, dict[str, np.ndarray]]]] = {}
# name -> reason, for graphs whose folded module differs from stock's (none known).
KNOWN_MISMATCH: dict[str, str] = {}
# name -> reason, for graphs whose folded module computes a different output (none known).
KNOWN_WRONG_OUTPUT: dict[str, str] = {}


def _graph(fn):
    GRAPHS[fn.__name__.lstrip("_")] = fn
    return fn


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _const(name: str, array: np.ndarray):
    """A ``Constant`` node (exporters emit these as often as initializers)."""
    return helper.make_node(
        "Constant", [], [name], value=numpy_helper.from_array(np.asarray(array), name + "_v")
    )


def _model(
    name: str,
    nodes: list,
    inputs: list[tuple[str, int, list]],
    outputs: list[tuple[str, int]],
    inits: dict[str, np.ndarray],
    opset: int = OPSET,
):
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="fold_guard"
    )
    model.ir_version = 8  # what the installed onnxruntime accepts
    # The checker wants output shapes: take them from ONNX shape inference.
    inferred = onnx.shape_inference.infer_shapes(model)
    known = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for k, out in enumerate(model.graph.output):
        if known.get(out.name) is not None and known[out.name].type.tensor_type.HasField("shape"):
            model.graph.output[k].CopyFrom(known[out.name])
    onnx.checker.check_model(model)
    return model


F = TensorProto.FLOAT
I64 = TensorProto.INT64
I32 = TensorProto.INT32


# ---------------------------------------------------------------------------------------------
# The graphs
# ---------------------------------------------------------------------------------------------


@_graph
def _transformer_block():
    """Pre-LN encoder block: LayerNorm, QKV MatMul+Add, multi-head attention with Reshape /
    Transpose, Div by Sqrt(constant), Softmax, output projection, residual, FFN with Erf-GELU and
    a second Tanh-GELU branch. Weights are stored transposed and fed through ``Transpose`` (as
    exporters of ``nn.Linear`` do), so the transposes fold."""
    rng = _rng(1)
    seq, d, heads = 4, 8, 2
    hd = d // heads
    inits = {
        "ln1_s": (1 + _f32(rng, d, scale=0.1)),
        "ln1_b": _f32(rng, d, scale=0.1),
        "ln2_s": (1 + _f32(rng, d, scale=0.1)),
        "ln2_b": _f32(rng, d, scale=0.1),
        "hd": np.array(hd, np.float32),
        "shape_heads": np.array([1, seq, heads, hd], np.int64),
        "shape_back": np.array([1, seq, d], np.int64),
        "half": np.array(0.5, np.float32),
        "one": np.array(1.0, np.float32),
        "two": np.array(2.0, np.float32),
        "c0044715": np.array(0.044715, np.float32),
        "three": np.array(3.0, np.float32),
        "sqrt_2_over_pi": np.array(np.sqrt(2 / np.pi), np.float32),
    }
    nodes = [
        helper.make_node(
            "LayerNormalization", ["x", "ln1_s", "ln1_b"], ["h"], axis=-1, epsilon=1e-5
        ),
        helper.make_node("Sqrt", ["hd"], ["sqrt_hd"]),  # constant subgraph
    ]
    for p in ("q", "k", "v", "o"):
        inits[f"w{p}_t"] = _f32(rng, d, d, scale=0.3)  # stored (out, in)
        inits[f"b{p}"] = _f32(rng, d, scale=0.1)
        nodes.append(helper.make_node("Transpose", [f"w{p}_t"], [f"w{p}"], perm=[1, 0]))
    for p in ("q", "k", "v"):
        nodes += [
            helper.make_node("MatMul", ["h", f"w{p}"], [f"{p}_mm"]),
            helper.make_node("Add", [f"{p}_mm", f"b{p}"], [f"{p}_lin"]),
            helper.make_node("Reshape", [f"{p}_lin", "shape_heads"], [f"{p}_r"]),
        ]
    nodes += [
        helper.make_node("Transpose", ["q_r"], ["q_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k_r"], ["k_t"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v_r"], ["v_t"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["q_t", "k_t"], ["scores"]),
        helper.make_node("Div", ["scores", "sqrt_hd"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v_t"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "shape_back"], ["ctx_r"]),
        helper.make_node("MatMul", ["ctx_r", "wo"], ["o_mm"]),
        helper.make_node("Add", ["o_mm", "bo"], ["o_lin"]),
        helper.make_node("Add", ["x", "o_lin"], ["res1"]),
        helper.make_node(
            "LayerNormalization", ["res1", "ln2_s", "ln2_b"], ["h2"], axis=-1, epsilon=1e-5
        ),
    ]
    # FFN: up-projection, Erf-GELU with Div by Sqrt(2) (constant subgraph), down-projection.
    ff = 16
    inits.update(
        w1_t=_f32(rng, ff, d, scale=0.3),
        b1=_f32(rng, ff, scale=0.1),
        w2_t=_f32(rng, d, ff, scale=0.3),
        b2=_f32(rng, d, scale=0.1),
    )
    nodes += [
        helper.make_node("Transpose", ["w1_t"], ["w1"], perm=[1, 0]),
        helper.make_node("Transpose", ["w2_t"], ["w2"], perm=[1, 0]),
        helper.make_node("MatMul", ["h2", "w1"], ["f1"]),
        helper.make_node("Add", ["f1", "b1"], ["f1b"]),
        helper.make_node("Sqrt", ["two"], ["sqrt2"]),
        helper.make_node("Div", ["f1b", "sqrt2"], ["g_div"]),
        helper.make_node("Erf", ["g_div"], ["g_erf"]),
        helper.make_node("Add", ["g_erf", "one"], ["g_add"]),
        helper.make_node("Mul", ["f1b", "g_add"], ["g_mul"]),
        helper.make_node("Mul", ["g_mul", "half"], ["gelu"]),
        # Tanh GELU of the same pre-activation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        helper.make_node("Pow", ["f1b", "three"], ["t_cube"]),
        helper.make_node("Mul", ["t_cube", "c0044715"], ["t_c"]),
        helper.make_node("Add", ["f1b", "t_c"], ["t_in"]),
        helper.make_node("Mul", ["t_in", "sqrt_2_over_pi"], ["t_s"]),
        helper.make_node("Tanh", ["t_s"], ["t_tanh"]),
        helper.make_node("Add", ["t_tanh", "one"], ["t_add"]),
        helper.make_node("Mul", ["f1b", "t_add"], ["t_mul"]),
        helper.make_node("Mul", ["t_mul", "half"], ["gelu_tanh"]),
        helper.make_node("Add", ["gelu", "gelu_tanh"], ["act"]),
        helper.make_node("MatMul", ["act", "w2"], ["f2"]),
        helper.make_node("Add", ["f2", "b2"], ["f2b"]),
        helper.make_node("Add", ["res1", "f2b"], ["y"]),
    ]
    model = _model("transformer_block", nodes, [("x", F, [1, seq, d])], [("y", F)], inits)
    return model, {"x": _f32(_rng(101), 1, seq, d)}


@_graph
def _shape_arithmetic():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, ConstantOfShape, Range, Expand and Where
    on constants (the usual exporter boilerplate around a flatten)."""
    inits = {
        "idx0": np.array(0, np.int64),
        "minus1": np.array([-1], np.int64),
        "r_start": np.array(0, np.int64),
        "r_limit": np.array(12, np.int64),
        "r_delta": np.array(1, np.int64),
        "cos_shape": np.array([2, 12], np.int64),
        "exp_shape": np.array([2, 12], np.int64),
        "row_shape": np.array([1, 12], np.int64),
        "mask": (np.arange(24).reshape(2, 12) % 3 == 0),
        "six": np.array(6, np.int64),
        "zero_f": np.array(0.0, np.float32),
    }
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Gather", ["x_shape", "idx0"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "unsq_axes"], ["batch_1d"]),
        _const("unsq_axes", np.array([0], np.int64)),
        helper.make_node("Concat", ["batch_1d", "minus1"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["x", "flat_shape"], ["x_flat"]),  # (2, 12)
        helper.make_node(
            "ConstantOfShape",
            ["cos_shape"],
            ["ones"],
            value=numpy_helper.from_array(np.array([1.5], np.float32), "v"),
        ),
        helper.make_node("Range", ["r_start", "r_limit", "r_delta"], ["ar"]),
        helper.make_node("Reshape", ["ar", "row_shape"], ["ar_row"]),
        helper.make_node("Expand", ["ar_row", "exp_shape"], ["ar_exp"]),
        helper.make_node("Less", ["ar_exp", "six"], ["lt6"]),
        helper.make_node("And", ["lt6", "mask"], ["both"]),
        helper.make_node("Cast", ["ar_exp"], ["ar_f"], to=F),
        helper.make_node("Where", ["both", "ar_f", "ones"], ["bias"]),
        helper.make_node("Where", ["mask", "zero_f", "bias"], ["bias2"]),
        helper.make_node("Add", ["x_flat", "bias2"], ["y"]),
    ]
    # Unsqueeze's Constant must precede it for the checker's topological order.
    nodes.insert(2, nodes.pop(3))
    model = _model("shape_arithmetic", nodes, [("x", F, [2, 3, 4])], [("y", F)], inits)
    return model, {"x": _f32(_rng(102), 2, 3, 4)}


@_graph
def _conv_batchnorm():
    """Conv + BatchNormalization (inference, constant statistics) + Relu, twice; the second conv's
    weight goes through a constant Mul (weight standardisation leftovers)."""
    rng = _rng(3)
    inits = {
        "w0": _f32(rng, 4, 3, 3, 3, scale=0.3),
        "b0": _f32(rng, 4, scale=0.1),
        "w1_raw": _f32(rng, 6, 4, 3, 3, scale=0.3),
        "w1_gain": np.array(0.75, np.float32),
    }
    for i, c in ((0, 4), (1, 6)):
        inits[f"bn{i}_s"] = 1 + _f32(rng, c, scale=0.1)
        inits[f"bn{i}_b"] = _f32(rng, c, scale=0.1)
        inits[f"bn{i}_m"] = _f32(rng, c, scale=0.1)
        inits[f"bn{i}_v"] = (np.abs(_f32(rng, c)) + 0.5).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization", ["c0", "bn0_s", "bn0_b", "bn0_m", "bn0_v"], ["n0"], epsilon=1e-5
        ),
        helper.make_node("Relu", ["n0"], ["r0"]),
        helper.make_node("Mul", ["w1_raw", "w1_gain"], ["w1"]),
        helper.make_node("Conv", ["r0", "w1"], ["c1"], kernel_shape=[3, 3], strides=[2, 2]),
        helper.make_node(
            "BatchNormalization", ["c1", "bn1_s", "bn1_b", "bn1_m", "bn1_v"], ["n1"], epsilon=1e-3
        ),
        helper.make_node("Relu", ["n1"], ["y"]),
    ]
    model = _model("conv_batchnorm", nodes, [("x", F, [1, 3, 8, 8])], [("y", F)], inits)
    return model, {"x": _f32(_rng(103), 1, 3, 8, 8)}


@_graph
def _gemm_transb():
    """Gemm with transB / alpha / beta on a runtime input, and a Gemm of two initializers."""
    rng = _rng(4)
    inits = {
        "w": _f32(rng, 6, 5, scale=0.5),
        "b": _f32(rng, 6, scale=0.1),
        "a_c": _f32(rng, 3, 4, scale=0.5),
        "b_c": _f32(rng, 5, 4, scale=0.5),
        "c_c": _f32(rng, 5, scale=0.1),
    }
    nodes = [
        helper.make_node(
            "Gemm", ["a_c", "b_c", "c_c"], ["const_gemm"], transB=1, alpha=0.5, beta=2.0
        ),  # (3,5)
        helper.make_node("Add", ["x", "const_gemm"], ["x2"]),
        helper.make_node("Gemm", ["x2", "w", "b"], ["y"], transB=1, alpha=1.25),
    ]
    model = _model("gemm_transb", nodes, [("x", F, [3, 5])], [("y", F)], inits)
    return model, {"x": _f32(_rng(104), 3, 5)}


@_graph
def _slice_split_squeeze():
    """Slice (with steps), Split and Squeeze of constant initializers feeding a runtime Add."""
    rng = _rng(5)
    inits = {
        "table": _f32(rng, 8, 12),
        "starts": np.array([1, 0], np.int64),
        "ends": np.array([7, 12], np.int64),
        "axes": np.array([0, 1], np.int64),
        "steps": np.array([2, 3], np.int64),
        "split_src": _f32(rng, 1, 3, 4),
        "split_sizes": np.array([1, 2], np.int64),
        "sq_axes": np.array([0], np.int64),
    }
    nodes = [
        helper.make_node("Slice", ["table", "starts", "ends", "axes", "steps"], ["sl"]),  # (3, 4)
        helper.make_node(
            "Split", ["split_src", "split_sizes"], ["sp_a", "sp_b"], axis=1
        ),  # (1,1,4) (1,2,4)
        helper.make_node("Squeeze", ["sp_a", "sq_axes"], ["sq_a"]),  # (1, 4)
        helper.make_node("Squeeze", ["sp_b", "sq_axes"], ["sq_b"]),  # (2, 4)
        helper.make_node("Concat", ["sq_a", "sq_b"], ["cat"], axis=0),  # (3, 4)
        helper.make_node("Add", ["sl", "cat"], ["c"]),
        helper.make_node("Mul", ["x", "c"], ["y"]),
    ]
    model = _model("slice_split_squeeze", nodes, [("x", F, [3, 4])], [("y", F)], inits)
    return model, {"x": _f32(_rng(105), 3, 4)}


@_graph
def _cast_chain():
    """Cast chains on computed constants: float32 -> float16 -> float32, float -> int32 -> int64 ->
    float, float -> int64 -> int8 -> float, bool -> float. The 0.27 frontend folds Cast (and Abs,
    Neg, Mul...) of an initializer itself in numpy, so every chain starts from an op it leaves to
    Relax (Exp / Floor / Ceil)."""
    rng = _rng(6)
    inits = {"c": _f32(rng, 2, 6, scale=2.0)}
    nodes = [
        helper.make_node("Exp", ["c"], ["ce"]),
        helper.make_node("Floor", ["c"], ["cfl"]),
        helper.make_node("Ceil", ["c"], ["cce"]),
        helper.make_node("Cast", ["ce"], ["c16"], to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["c16"], ["c32"], to=F),
        helper.make_node("Cast", ["cfl"], ["ci32"], to=I32),
        helper.make_node("Cast", ["ci32"], ["ci64"], to=I64),
        helper.make_node("Cast", ["ci64"], ["cf"], to=F),
        helper.make_node("Cast", ["cce"], ["k64"], to=I64),
        helper.make_node("Cast", ["k64"], ["k8"], to=TensorProto.INT8),
        helper.make_node("Cast", ["k8"], ["kf"], to=F),
        helper.make_node("Greater", ["ce", "cf"], ["gt"]),
        helper.make_node("Cast", ["gt"], ["gtf"], to=F),
        helper.make_node("Sum", ["c32", "cf", "kf", "gtf"], ["s"]),
        helper.make_node("Add", ["x", "s"], ["y"]),
    ]
    model = _model("cast_chain", nodes, [("x", F, [2, 6])], [("y", F)], inits)
    return model, {"x": _f32(_rng(106), 2, 6)}


@_graph
def _qdq_per_tensor_int8():
    """Per-tensor int8 Q/DQ of initializers: a float weight through QuantizeLinear ->
    DequantizeLinear (the pattern float-weight QDQ exporters emit), and an int8 weight through
    DequantizeLinear only, both feeding MatMul."""
    rng = _rng(7)
    inits = {
        "w_f": _f32(rng, 6, 5, scale=0.5),
        "w_scale": np.array(0.01, np.float32),
        "w_zp": np.array(3, np.int8),
        "w_q": rng.integers(-128, 128, size=(5, 4)).astype(np.int8),
        "wq_scale": np.array(0.02, np.float32),
        "wq_zp": np.array(-2, np.int8),
        "bias_q": rng.integers(-1000, 1000, size=(4,)).astype(np.int32),
        "bias_scale": np.array(0.0002, np.float32),
    }
    nodes = [
        helper.make_node("QuantizeLinear", ["w_f", "w_scale", "w_zp"], ["w_fq"]),
        helper.make_node("DequantizeLinear", ["w_fq", "w_scale", "w_zp"], ["w_fdq"]),
        helper.make_node("DequantizeLinear", ["w_q", "wq_scale", "wq_zp"], ["w_qdq"]),
        helper.make_node("DequantizeLinear", ["bias_q", "bias_scale"], ["bias"]),
        helper.make_node("MatMul", ["x", "w_fdq"], ["h"]),
        helper.make_node("MatMul", ["h", "w_qdq"], ["h2"]),
        helper.make_node("Add", ["h2", "bias"], ["y"]),
    ]
    model = _model("qdq_per_tensor_int8", nodes, [("x", F, [3, 6])], [("y", F)], inits)
    return model, {"x": _f32(_rng(107), 3, 6)}


@_graph
def _qdq_per_axis_uint8():
    """Per-axis Q/DQ of initializers: a uint8 conv weight with per-channel scales and zero
    points (axis 0), a float weight quantized per-axis to uint8 (axis 1) and dequantized, and a
    per-axis int8 weight (axis 0) for a second conv."""
    rng = _rng(8)
    inits = {
        "w0_q": rng.integers(0, 256, size=(4, 3, 3, 3)).astype(np.uint8),
        "w0_s": np.array([0.01, 0.02, 0.015, 0.005], np.float32),
        "w0_zp": np.array([128, 120, 130, 127], np.uint8),
        "w1_q": rng.integers(-128, 128, size=(5, 4, 1, 1)).astype(np.int8),
        "w1_s": np.array([0.01, 0.02, 0.03, 0.04, 0.05], np.float32),
        "w1_zp": np.zeros(5, np.int8),
        "m_f": _f32(rng, 5, 6, scale=0.4),
        "m_s": np.array([0.004, 0.003, 0.005, 0.006, 0.002, 0.007], np.float32),
        "m_zp": np.array([128, 100, 150, 128, 128, 90], np.uint8),
        "flat_shape": np.array([1, 5, 36], np.int64),
    }
    nodes = [
        helper.make_node("DequantizeLinear", ["w0_q", "w0_s", "w0_zp"], ["w0"], axis=0),
        helper.make_node("DequantizeLinear", ["w1_q", "w1_s", "w1_zp"], ["w1"], axis=0),
        helper.make_node("QuantizeLinear", ["m_f", "m_s", "m_zp"], ["m_q"], axis=1),
        helper.make_node("DequantizeLinear", ["m_q", "m_s", "m_zp"], ["m"], axis=1),
        helper.make_node("Conv", ["x", "w0"], ["c0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1"], ["c1"], kernel_shape=[1, 1]),  # (1,5,6,6)
        helper.make_node("Reshape", ["c1", "flat_shape"], ["c1f"]),  # (1,5,36)
        helper.make_node("Transpose", ["c1f"], ["c1t"], perm=[0, 2, 1]),  # (1,36,5)
        helper.make_node("MatMul", ["c1t", "m"], ["y"]),  # (1,36,6)
    ]
    model = _model("qdq_per_axis_uint8", nodes, [("x", F, [1, 3, 6, 6])], [("y", F)], inits)
    return model, {"x": _f32(_rng(108), 1, 3, 6, 6)}


@_graph
def _pad():
    """Pad of a constant initializer (constant mode with a value) and of the input (constant,
    reflect and edge modes) with constant pads."""
    rng = _rng(9)
    inits = {
        "k": _f32(rng, 2, 3),
        "k_pads": np.array([1, 0, 0, 1], np.int64),  # -> (3, 4)
        "k_val": np.array(0.25, np.float32),
        "x_pads": np.array([0, 1, 0, 2], np.int64),  # axis 1: 1 before, 2 after
        "r_pads": np.array([1, 0, 1, 0], np.int64),  # (3,4) -> (5,4)
        "e_pads": np.array([0, 0, 2, 0], np.int64),  # (5,4) -> (7,4)
    }
    nodes = [
        helper.make_node("Pad", ["k", "k_pads", "k_val"], ["kp"], mode="constant"),
        helper.make_node("Add", ["x", "kp"], ["s"]),  # (3, 4)
        helper.make_node("Pad", ["s", "r_pads"], ["sr"], mode="reflect"),  # (5, 4)
        helper.make_node("Pad", ["sr", "e_pads"], ["se"], mode="edge"),  # (7, 4)
        helper.make_node("Pad", ["se", "x_pads"], ["y"], mode="constant"),  # (7, 7)
    ]
    model = _model("pad", nodes, [("x", F, [3, 4])], [("y", F)], inits)
    return model, {"x": _f32(_rng(109), 3, 4)}


@_graph
def _resize():
    """Resize of the input (nearest, scales) and of a constant initializer (linear, sizes)."""
    rng = _rng(10)
    inits = {
        "scales": np.array([1, 1, 2, 2], np.float32),
        "k": _f32(rng, 1, 2, 2, 2),
        "k_sizes": np.array([1, 2, 4, 4], np.int64),
    }
    nodes = [
        helper.make_node("Resize", ["x", "", "scales"], ["xr"], mode="nearest"),
        helper.make_node("Resize", ["k", "", "", "k_sizes"], ["kr"], mode="linear"),
        helper.make_node("Add", ["xr", "kr"], ["y"]),
    ]
    model = _model("resize", nodes, [("x", F, [1, 2, 2, 2])], [("y", F)], inits)
    return model, {"x": _f32(_rng(110), 1, 2, 2, 2)}


@_graph
def _tile_cumsum():
    """Tile of a constant with constant repeats, CumSum of constants (plain, exclusive, reverse;
    float and int64), mixed into the input."""
    rng = _rng(11)
    inits = {
        "t": _f32(rng, 1, 3),
        "reps": np.array([2, 2], np.int64),
        "cs": _f32(rng, 2, 6),
        "ax1": np.array(1, np.int32),
        "ax0": np.array(0, np.int64),
        "ci": np.arange(12, dtype=np.int64).reshape(2, 6),
    }
    nodes = [
        helper.make_node("Tile", ["t", "reps"], ["tt"]),  # (2, 6)
        helper.make_node("CumSum", ["cs", "ax1"], ["c1"]),
        helper.make_node("CumSum", ["cs", "ax1"], ["c2"], exclusive=1),
        helper.make_node("CumSum", ["cs", "ax0"], ["c3"], reverse=1),
        helper.make_node("CumSum", ["ci", "ax1"], ["c4i"]),
        helper.make_node("Cast", ["c4i"], ["c4"], to=F),
        helper.make_node("Sum", ["tt", "c1", "c2", "c3", "c4"], ["s"]),
        helper.make_node("Add", ["x", "s"], ["y"]),
    ]
    model = _model("tile_cumsum", nodes, [("x", F, [2, 6])], [("y", F)], inits)
    return model, {"x": _f32(_rng(111), 2, 6)}


@_graph
def _topk_argmax():
    """TopK (values and indices) and ArgMax / ArgMin / ReduceMax of constants, used at runtime."""
    rng = _rng(12)
    inits = {
        "scores": _f32(rng, 3, 4),
        "k": np.array([4], np.int64),
    }
    nodes = [
        helper.make_node("TopK", ["scores", "k"], ["vals", "idx"], axis=1),  # (3,4), (3,4)
        helper.make_node("ArgMax", ["scores"], ["am"], axis=1, keepdims=1),  # (3,1)
        helper.make_node("ArgMin", ["scores"], ["an"], axis=1, keepdims=1),  # (3,1)
        helper.make_node(
            "ReduceMax", ["scores"], ["rm"], axes=[1], keepdims=1
        ),  # (3,1) (opset<18 attr)
        helper.make_node("Cast", ["idx"], ["idx_f"], to=F),
        helper.make_node("Cast", ["am"], ["am_f"], to=F),
        helper.make_node("Cast", ["an"], ["an_f"], to=F),
        helper.make_node("Add", ["vals", "idx_f"], ["s1"]),
        helper.make_node("Add", ["s1", "am_f"], ["s2"]),
        helper.make_node("Sub", ["s2", "an_f"], ["s3"]),
        helper.make_node("Mul", ["s3", "rm"], ["s4"]),
        helper.make_node("Add", ["x", "s4"], ["y"]),
        helper.make_node("GatherElements", ["x", "idx"], ["g"], axis=1),
    ]
    model = _model("topk_argmax", nodes, [("x", F, [3, 4])], [("y", F), ("g", F)], inits)
    return model, {"x": _f32(_rng(112), 3, 4)}


@_graph
def _einsum():
    """Einsum of two constants ("ij,jk->ik") and of the input with a constant ("bij,jk->bik")."""
    rng = _rng(13)
    inits = {"a": _f32(rng, 3, 4), "b": _f32(rng, 4, 5), "c": _f32(rng, 5, 2)}
    nodes = [
        helper.make_node("Einsum", ["a", "b"], ["ab"], equation="ij,jk->ik"),  # (3,5)
        helper.make_node("Einsum", ["x", "ab"], ["xab"], equation="bij,jk->bik"),  # (2, 4, 5)
        helper.make_node("Einsum", ["xab", "c"], ["y"], equation="bik,kl->bil"),
    ]
    model = _model("einsum", nodes, [("x", F, [2, 4, 3])], [("y", F)], inits)
    return model, {"x": _f32(_rng(113), 2, 4, 3)}


@_graph
def _clip():
    """Clip with constant min / max on the input and on a constant (also min-only and Constant
    node bounds), Min / Max against constants."""
    rng = _rng(14)
    inits = {
        "lo": np.array(-0.5, np.float32),
        "hi": np.array(0.75, np.float32),
        "k": _f32(rng, 2, 5, scale=2.0),
        "cap": _f32(rng, 2, 5),
    }
    nodes = [
        _const("lo6", np.array(0.0, np.float32)),
        _const("hi6", np.array(6.0, np.float32)),
        helper.make_node("Clip", ["k", "lo", "hi"], ["kc"]),
        helper.make_node("Clip", ["k", "lo"], ["kmin"]),
        helper.make_node("Min", ["kc", "cap"], ["kmn"]),
        helper.make_node("Max", ["kmin", "kmn"], ["kmx"]),
        helper.make_node("Add", ["x", "kmx"], ["s"]),
        helper.make_node("Clip", ["s", "lo6", "hi6"], ["y"]),  # ReLU6
    ]
    model = _model("clip", nodes, [("x", F, [2, 5])], [("y", F)], inits)
    return model, {"x": _f32(_rng(114), 2, 5, scale=3.0)}


@_graph
def _dynamic_batch():
    """Symbolic batch "N": a Linear with a transposed weight (folds), bias arithmetic on constants
    (folds), a Reshape whose target comes from Shape(x) -> Gather -> Unsqueeze -> Concat (does
    not fold: it depends on N), and a constant LayerNorm-style scale built with ConstantOfShape."""
    rng = _rng(15)
    inits = {
        "w_t": _f32(rng, 6, 8, scale=0.3),
        "b": _f32(rng, 6, scale=0.1),
        "b_gain": np.array(2.0, np.float32),
        "idx0": np.array(0, np.int64),
        "tail": np.array([2, 3], np.int64),
        "cos_shape": np.array([3], np.int64),
        "unsq_axes": np.array([0], np.int64),
    }
    nodes = [
        helper.make_node("Transpose", ["w_t"], ["w"], perm=[1, 0]),
        helper.make_node("Mul", ["b", "b_gain"], ["b2"]),
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "b2"], ["hb"]),  # (N, 6)
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Gather", ["xs", "idx0"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "unsq_axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "tail"], ["new_shape"], axis=0),
        helper.make_node("Reshape", ["hb", "new_shape"], ["hr"]),  # (N, 2, 3)
        helper.make_node(
            "ConstantOfShape",
            ["cos_shape"],
            ["g"],
            value=numpy_helper.from_array(np.array([0.5], np.float32), "v"),
        ),
        helper.make_node("Exp", ["g"], ["ge"]),
        helper.make_node("Mul", ["hr", "ge"], ["y"]),
    ]
    model = _model("dynamic_batch", nodes, [("x", F, ["N", 8])], [("y", F)], inits)
    return model, {"x": _f32(_rng(115), 2, 8)}


@_graph
def _dynamic_seq_attention():
    """Symbolic batch and sequence ("N", "S"): a single attention head with folded transposed
    weights, Div by Sqrt(constant) and a constant additive bias built from Range/Expand."""
    rng = _rng(16)
    d = 4
    inits = {
        "wq_t": _f32(rng, d, d, scale=0.4),
        "wk_t": _f32(rng, d, d, scale=0.4),
        "d": np.array(d, np.float32),
        "r0": np.array(0, np.int64),
        "r1": np.array(d, np.int64),
        "rd": np.array(1, np.int64),
        "scale": np.array(0.1, np.float32),
    }
    nodes = [
        helper.make_node("Transpose", ["wq_t"], ["wq"], perm=[1, 0]),
        helper.make_node("Transpose", ["wk_t"], ["wk"], perm=[1, 0]),
        helper.make_node("Sqrt", ["d"], ["sd"]),
        helper.make_node("Range", ["r0", "r1", "rd"], ["ar"]),
        helper.make_node("Cast", ["ar"], ["arf"], to=F),
        helper.make_node("Mul", ["arf", "scale"], ["pos"]),  # (d,) constant
        helper.make_node("Add", ["x", "pos"], ["xp"]),
        helper.make_node("MatMul", ["xp", "wq"], ["q"]),
        helper.make_node("MatMul", ["xp", "wk"], ["k"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Div", ["s", "sd"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "xp"], ["y"]),
    ]
    model = _model("dynamic_seq_attention", nodes, [("x", F, ["N", "S", d])], [("y", F)], inits)
    return model, {"x": _f32(_rng(116), 2, 3, d)}


@_graph
def _elementwise_constants():
    """Unary / binary math on constants that exporters leave behind: Reciprocal, Pow, Exp, Log,
    Neg, Abs, Floor, Ceil, Round, Sign, integer Div / Mod (floor vs trunc semantics), Equal/Not."""
    rng = _rng(17)
    inits = {
        "a": (np.abs(_f32(rng, 2, 6)) + 0.1).astype(np.float32),
        "b": _f32(rng, 2, 6, scale=2.5),
        "e": np.array(1.5, np.float32),
        "ia": np.array([[-7, -3, 5, 9, 11, -12], [4, -4, 13, -13, 2, 0]], np.int64),
        "ib": np.array([[2, 2, -3, 4, -5, 5], [3, 3, -4, 4, 7, 1]], np.int64),
    }
    nodes = [
        helper.make_node("Reciprocal", ["a"], ["r"]),
        helper.make_node("Pow", ["a", "e"], ["p"]),
        helper.make_node("Log", ["a"], ["l"]),
        helper.make_node("Exp", ["b"], ["ex"]),
        helper.make_node("Neg", ["b"], ["n"]),
        helper.make_node("Abs", ["b"], ["ab"]),
        helper.make_node("Floor", ["b"], ["fl"]),
        helper.make_node("Ceil", ["b"], ["ce"]),
        helper.make_node("Round", ["b"], ["ro"]),
        helper.make_node("Sign", ["b"], ["sg"]),
        helper.make_node("Div", ["ia", "ib"], ["idiv"]),
        helper.make_node("Mod", ["ia", "ib"], ["imod"]),  # fmod=0: sign of divisor
        helper.make_node("Mod", ["ia", "ib"], ["ifmod"], fmod=1),
        helper.make_node("Equal", ["idiv", "imod"], ["eq"]),
        helper.make_node("Not", ["eq"], ["neq"]),
        helper.make_node("Cast", ["neq"], ["neqf"], to=F),
        helper.make_node("Cast", ["idiv"], ["idivf"], to=F),
        helper.make_node("Cast", ["imod"], ["imodf"], to=F),
        helper.make_node("Cast", ["ifmod"], ["ifmodf"], to=F),
        helper.make_node(
            "Sum",
            [
                "r",
                "p",
                "l",
                "ex",
                "n",
                "ab",
                "fl",
                "ce",
                "ro",
                "sg",
                "neqf",
                "idivf",
                "imodf",
                "ifmodf",
            ],
            ["s"],
        ),
        helper.make_node("Mul", ["x", "s"], ["y"]),
    ]
    model = _model("elementwise_constants", nodes, [("x", F, [2, 6])], [("y", F)], inits)
    return model, {"x": _f32(_rng(117), 2, 6)}


@_graph
def _gather_embedding():
    """Embedding lookup of constant token ids (Gather on an initializer, folds), position ids from
    Range + Unsqueeze, and a runtime Gather of the table by input ids (int64 input)."""
    rng = _rng(18)
    inits = {
        "table": _f32(rng, 10, 4),
        "pos_table": _f32(rng, 5, 4),
        "const_ids": np.array([[1, 3, 3, 7, 0]], np.int64),
        "r0": np.array(0, np.int64),
        "r1": np.array(5, np.int64),
        "rd": np.array(1, np.int64),
        "ax0": np.array([0], np.int64),
    }
    nodes = [
        helper.make_node("Gather", ["table", "const_ids"], ["const_emb"], axis=0),  # (1,5,4)
        helper.make_node("Range", ["r0", "r1", "rd"], ["pos"]),
        helper.make_node("Unsqueeze", ["pos", "ax0"], ["pos1"]),  # (1,5)
        helper.make_node("Gather", ["pos_table", "pos1"], ["pos_emb"], axis=0),  # (1,5,4)
        helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),  # (1,5,4)
        helper.make_node("Add", ["emb", "pos_emb"], ["e1"]),
        helper.make_node("Add", ["e1", "const_emb"], ["y"]),
    ]
    model = _model("gather_embedding", nodes, [("ids", I64, [1, 5])], [("y", F)], inits)
    return model, {"ids": np.array([[9, 0, 4, 4, 2]], np.int64)}


@_graph
def _expand_sum():
    """Expand / ConstantOfShape / Reshape of constants to ``Shape(x)`` (static), summed with the
    input by a variadic Sum, which the frontend lowers to broadcast_to + stack + sum. The
    ``broadcast_to`` calls on constants have one target shape but different input shapes."""
    inits = {
        "c": np.arange(4, dtype=np.float32).reshape(1, 4),
        "c12": np.arange(12, dtype=np.float32),
    }
    nodes = [
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Expand", ["c", "xs"], ["e"]),
        helper.make_node(
            "ConstantOfShape",
            ["xs"],
            ["z"],
            value=numpy_helper.from_array(np.array([0.5], np.float32), "v"),
        ),
        helper.make_node("Reshape", ["c12", "xs"], ["r"]),
        helper.make_node("Sum", ["x", "e", "z", "r"], ["y"]),
    ]
    model = _model("expand_sum", nodes, [("x", F, [3, 4])], [("y", F)], inits)
    return model, {"x": _f32(_rng(119), 3, 4)}


# Not included because apache-tvm 0.27's ONNX frontend cannot import them: none so far. Every
# op asked for (Resize, Einsum, TopK, CumSum, LayerNormalization, per-axis Q/DQ...) imports.

NAMES = list(GRAPHS)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

_CACHE: dict[str, dict] = {}


def _case(name: str) -> dict:
    """The ONNX model, its feed, its Relax import and both folded modules (computed once)."""
    if name not in _CACHE:
        from tvm.relax.frontend.onnx import from_onnx

        model, feed = GRAPHS[name]()
        mod = from_onnx(model, keep_params_in_input=False)
        _CACHE[name] = {
            "model": model,
            "feed": feed,
            "mod": mod,
            "ours": fgr.FoldConstant()(mod),
            "stock": relax.transform.FoldConstant()(mod),
        }
    return _CACHE[name]


def _constants(mod: tvm.IRModule) -> list[np.ndarray]:
    found: list[np.ndarray] = []
    for _, func in sorted(mod.functions.items(), key=lambda it: it[0].name_hint):
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(
                func,
                lambda node: (
                    found.append(node.value.numpy()) if isinstance(node, _CONST_TYPE) else None
                ),
            )
    return found


def _mismatch_message(ours: tvm.IRModule, stock: tvm.IRModule) -> str:
    mismatch = None
    getter = getattr(tvm_ffi, "get_first_structural_mismatch", None)
    if getter is not None:
        mismatch = getter(ours, stock)
    return (
        f"first mismatch: {mismatch}\n--- ours ---\n{ours.script(show_meta=False)}\n"
        f"--- stock ---\n{stock.script(show_meta=False)}"
    )


def _flatten(value) -> list[np.ndarray]:
    if hasattr(value, "numpy"):
        return [value.numpy()]
    return [array for item in value for array in _flatten(item)]


def _run_tvm(mod: tvm.IRModule, arrays: list[np.ndarray]) -> list[np.ndarray]:
    exe = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(exe, tvm.cpu())
    return _flatten(vm["main"](*[tvm.runtime.tensor(a, tvm.cpu()) for a in arrays]))


def _run_ort(model, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return [np.asarray(out) for out in session.run(None, feed)]


def _params(names: list[str], known: dict[str, str]):
    return [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=known[n])) if n in known else n
        for n in names
    ]


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------


def test_graph_count():
    assert len(NAMES) >= 12


@pytest.mark.stock
@pytest.mark.parametrize("name", NAMES)
def test_import_has_constants_to_fold(name):
    """Each graph is a real test of folding: stock changes the module."""
    case = _case(name)
    assert not tvm_ffi.structural_equal(case["mod"], case["stock"]), (
        "stock FoldConstant does nothing here"
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", _params(NAMES, KNOWN_MISMATCH))
def test_matches_stock(name):
    case = _case(name)
    ours, stock = case["ours"], case["stock"]
    assert tvm_ffi.structural_equal(ours, stock), _mismatch_message(ours, stock)
    tvm.ir.assert_structural_equal(ours, stock)
    ours_c, stock_c = _constants(ours), _constants(stock)
    assert len(ours_c) == len(stock_c)
    for k, (a, b) in enumerate(zip(ours_c, stock_c)):
        assert a.dtype == b.dtype and a.shape == b.shape, k
        assert a.tobytes() == b.tobytes(), f"constant #{k} differs in its bits"


@pytest.mark.slow
@pytest.mark.parametrize("name", _params(NAMES, KNOWN_WRONG_OUTPUT))
def test_numerics(name):
    case = _case(name)
    model, feed = case["model"], case["feed"]
    arrays = [feed[inp.name] for inp in model.graph.input]
    before = _run_tvm(case["mod"], arrays)
    after = _run_tvm(case["ours"], arrays)
    expected = _run_ort(model, feed)
    assert len(before) == len(after) == len(expected)
    for b, a, e in zip(before, after, expected):
        assert b.dtype == a.dtype and b.shape == a.shape
        assert b.tobytes() == a.tobytes(), "folding changed the output bits"
        assert a.shape == e.shape and a.dtype == e.dtype
        if np.issubdtype(e.dtype, np.floating):
            np.testing.assert_allclose(a, e, rtol=FLOAT_RTOL, atol=FLOAT_ATOL)
        else:
            np.testing.assert_array_equal(a, e)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_strict_fold_does_not_raise(name):
    result = fgr.fold(_case(name)["mod"], strict=True)
    assert isinstance(result.mod, tvm.IRModule)


# ---------------------------------------------------------------------------------------------
# Reduced reproductions of the discrepancies found by the sweep
# ---------------------------------------------------------------------------------------------


def _reduced_shape_param() -> tvm.IRModule:
    s = relax.Var(
        "s",
        relax.ShapeType([3, 4]) if hasattr(relax, "ShapeType") else relax.ShapeStructInfo([3, 4]),
    )
    bb = relax.BlockBuilder()
    with bb.function("main", [s]):
        with bb.dataflow():
            gv = bb.emit_output(relax.op.shape_to_tensor(s))
        bb.emit_func_output(gv)
    return bb.get()


def _reduced_shape_of() -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((3, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(relax.op.shape_of(x))
            gv = bb.emit_output(relax.op.shape_to_tensor(s))
        bb.emit_func_output(gv)
    return bb.get()


def _reduced_broadcast_to() -> tvm.IRModule:
    a = relax.const(np.arange(4, dtype="float32").reshape(1, 4), "float32")
    b = relax.const(np.arange(12, dtype="float32").reshape(3, 4), "float32")
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        with bb.dataflow():
            y0 = bb.emit(relax.op.broadcast_to(a, (3, 4)))
            y1 = bb.emit(relax.op.broadcast_to(b, (3, 4)))
            gv = bb.emit_output(relax.Tuple([y0, y1]))
        bb.emit_func_output(gv)
    return bb.get()


def _reduced_full_of_shape_of() -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((3, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(relax.op.shape_of(x))
            gv = bb.emit_output(relax.op.zeros(s, "float32"))
        bb.emit_func_output(gv)
    return bb.get()


# Reduced from graphs above; each once differed from stock (fixed since, kept as regressions).
REDUCED = {
    # Stock: `return R.const([3, 4], "int64")`: shape_to_tensor of a shape var known from its type.
    "shape_to_tensor_of_static_shape_param": _reduced_shape_param,
    "shape_to_tensor_of_shape_of_static_tensor": _reduced_shape_of,
    # Two broadcast_to of (1, 4) and (3, 4) to (3, 4): a size-1 dim must not become symbolic.
    "broadcast_to_same_target_different_input_shapes": _reduced_broadcast_to,
}


@pytest.mark.parametrize("name", list(REDUCED))
def test_reduced_matches_stock(name):
    mod = REDUCED[name]()
    ours, stock = fgr.FoldConstant()(mod), relax.transform.FoldConstant()(mod)
    assert tvm_ffi.structural_equal(ours, stock), _mismatch_message(ours, stock)
    ours_constants, stock_constants = _constants(ours), _constants(stock)
    assert len(ours_constants) == len(stock_constants)
    for a, b in zip(ours_constants, stock_constants):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), (
            f"{name}: a constant differs from stock"
        )


def test_zeros_of_shape_of_leaves_no_legalization_debris():
    """A deliberate difference from stock, which does not fold R.zeros(shape_of(x)) either.

    Stock leaves behind two bindings from its failed legalization attempt
    (`lv_1 = lv; lv1 = R.match_cast(lv_1, R.Shape([s0, s1]))`); fold_guard legalizes in a
    scratch module, so the function keeps exactly its original bindings.
    """
    mod = _reduced_full_of_shape_of()
    ours, stock = fgr.FoldConstant()(mod), relax.transform.FoldConstant()(mod)
    tvm.ir.assert_structural_equal(ours, mod)
    assert (
        len(stock["main"].body.blocks[0].bindings) == len(mod["main"].body.blocks[0].bindings) + 2
    )
    # the frontend's module is not well formed (a dataflow var in gv's type), so strict refuses it
    assert not relax.analysis.check_well_formed(mod)
    with pytest.raises(fold_guard.PreconditionError, match="not well formed"):
        fgr.fold(mod, strict=True)
