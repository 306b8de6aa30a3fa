"""Low-bit LLM weights as Relax sees them: MLC-LLM's q4f16_1 layout and TVM's CUTLASS-style flow.

Two real forms in which a weight's dequantize is a kernel (``call_tir``), not ``R.dequantize``:

* **MLC-LLM's group quantization, q4f16_1** (``GroupQuantize``, linear layout ``NK``): a weight
  ``W`` of ``(out, in)`` float16 is stored as ``packed`` ``(out, in / 8)`` uint32, eight 4-bit
  values per word, value ``j`` of a word in bits ``4 j .. 4 j + 3``, and ``scale`` ``(out, in /
  32)`` float16, one per group of 32 along ``in``. Symmetric, with the zero point 7::

      scale[o, g] = max(|W[o, 32 g : 32 g + 32]|) / 7
      q[o, i]     = clip(round(W[o, i] / scale[o, i // 32] + 7), 0, 14)
      W'[o, i]    = (q[o, i] - 7) * scale[o, i // 32]

  The model computes ``W'`` at run time with a TE kernel named ``dequantize`` (MLC:
  ``nn.op.tensor_expr_op(..., name_hint="dequantize")``), so a projection reads
  ``call_tir(dequantize, (packed, scale)) -> permute_dims -> matmul``: the form MLC-LLM's
  ``FuseDequantizeTranspose`` / ``FuseDequantizeMatmulEwise`` fuse (they find the kernel by
  ``name_hint.startswith("dequantize")``). :func:`build_decoder_block` puts seven of them in a
  Llama-style decoder block with the generated weights bound as constants, as ``BindParams`` or
  a baked model does.

* **TVM's CUTLASS-style flow** (``tests/python/relax/test_codegen_cutlass.py``): ``main`` takes the
  float16 weight as a parameter (``num_input``), an ``encode`` kernel turns it into int8 (or two
  int4 in an int8) plus float16 scales, and a ``decode`` kernel feeds ``matmul``: the form
  ``relax.backend.cuda.cutlass``'s ``decode_matmul`` patterns match (``"decode" in name_hint``, an
  int8 weight, scales of shape ``(N,)``). :func:`build_cutlass_style_module` builds it; the encode
  belongs in ``main_transform_params`` after ``LiftTransformParams``, the decode in ``main``.

The NumPy functions (:func:`quantize_q4f16_1`, :func:`dequantize_q4f16_1`, :func:`encode_int8`,
:func:`decode_int8`) are the references the kernels are checked against.

Examples
--------
>>> w = np.random.default_rng(0).uniform(-1, 1, (4, 64)).astype("float16")
>>> packed, scale = quantize_q4f16_1(w)
>>> packed.shape, packed.dtype.name, scale.shape, scale.dtype.name
((4, 8), 'uint32', (4, 2), 'float16')
>>> bool(np.abs(dequantize_q4f16_1(packed, scale) - w).max() <= scale.max() / 2 + 1e-3)
True
>>> mod = build_decoder_block(hidden=64, intermediate=128, heads=2)
>>> sorted(name for name in projection_names())
['down', 'gate', 'k', 'o', 'q', 'up', 'v']
>>> len(dequantize_calls(mod))
7
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np
import tvm
from tvm import relax, te
from tvm import tirx as tir  # 0.27 renamed tvm.tir to tvm.tirx

__all__ = [
    "ELEMS_PER_WORD",
    "GROUP_SIZE",
    "ZERO_POINT",
    "Projection",
    "block_inputs",
    "build_cutlass_style_module",
    "build_decoder_block",
    "constant_bytes",
    "decode_int8",
    "decoder_projections",
    "dequantize_calls",
    "dequantize_q4f16_1",
    "dequantize_q4f16_1_te",
    "encode_int8",
    "kernel_calls",
    "projection_names",
    "quantize_q4f16_1",
]

#: q4f16_1: one float16 scale per 32 weights along the input axis.
GROUP_SIZE = 32
#: Eight 4-bit values in one uint32 word.
ELEMS_PER_WORD = 8
#: The 4-bit values are stored as ``q + 7`` (MLC's ``max_int_value`` for int4), in [0, 14].
ZERO_POINT = 7
_BITS = 4
_MASK = (1 << _BITS) - 1


@dataclass(frozen=True)
class Projection:
    """One linear layer of the block: ``y = x @ W.T`` with ``W`` of ``(out_features, in_features)``."""

    name: str
    in_features: int
    out_features: int


def projection_names() -> Tuple[str, ...]:
    """The seven projections of a Llama decoder layer, in the order the block computes them."""
    return ("q", "k", "v", "o", "gate", "up", "down")


def decoder_projections(hidden: int, intermediate: int) -> List[Projection]:
    """The shapes of a Llama layer's projections (4096 / 11008 for a 7B model).

    >>> [(p.name, p.in_features, p.out_features) for p in decoder_projections(4096, 11008)][3:5]
    [('o', 4096, 4096), ('gate', 4096, 11008)]
    """
    square = [Projection(name, hidden, hidden) for name in ("q", "k", "v", "o")]
    return square + [
        Projection("gate", hidden, intermediate),
        Projection("up", hidden, intermediate),
        Projection("down", intermediate, hidden),
    ]


# --- q4f16_1 in NumPy ------------------------------------------------------------------------


def quantize_q4f16_1(weight: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``(packed uint32 (out, in / 8), scale float16 (out, in / 32))`` of a weight ``(out, in)``.

    The scale is computed in float16 as MLC does (``max_abs.astype(float16) / 7``); an all-zero
    group gets scale 1 rather than a division by zero (its values are all ``7``, i.e. zero).
    """
    out_features, in_features = weight.shape
    if in_features % GROUP_SIZE:
        raise ValueError(f"in_features {in_features} is not a multiple of {GROUP_SIZE}")
    w = weight.astype(np.float16)
    groups = w.reshape(out_features, in_features // GROUP_SIZE, GROUP_SIZE)
    scale = (np.abs(groups).max(axis=2) / np.float16(ZERO_POINT)).astype(np.float16)
    scale[scale == 0] = np.float16(1)
    scaled = groups.astype(np.float32) / scale.astype(np.float32)[:, :, None] + ZERO_POINT
    q = np.clip(np.round(scaled), 0, 2 * ZERO_POINT).astype(np.uint32)
    q = q.reshape(out_features, in_features // ELEMS_PER_WORD, ELEMS_PER_WORD)
    shifts = (np.arange(ELEMS_PER_WORD, dtype=np.uint32) * _BITS)[None, None, :]
    packed = np.bitwise_or.reduce(q << shifts, axis=2).astype(np.uint32)
    return packed, scale


def dequantize_q4f16_1(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The float16 weight ``(out, in)`` that the ``dequantize`` kernel computes."""
    out_features, words = packed.shape
    shifts = (np.arange(ELEMS_PER_WORD, dtype=np.uint32) * _BITS)[None, None, :]
    q = ((packed[:, :, None] >> shifts) & _MASK).reshape(out_features, words * ELEMS_PER_WORD)
    s = np.repeat(scale, GROUP_SIZE, axis=1)
    return ((q.astype(np.float16) - np.float16(ZERO_POINT)) * s).astype(np.float16)


# --- q4f16_1 as a TE kernel -------------------------------------------------------------------


def dequantize_q4f16_1_te(packed: te.Tensor, scale: te.Tensor) -> te.Tensor:
    """MLC's NK-layout ``dequantize``: ``(unpack(packed)[o, i] - 7) * scale[o, i // 32]``.

    Written for ``bb.emit_te`` / ``bb.call_te``; the TE stage is named ``dequantize`` as MLC's
    ``_dequantize`` names it.
    """
    out_features, words = packed.shape
    dtype = scale.dtype
    shape = (out_features, words * ELEMS_PER_WORD)

    def element(o: tir.PrimExpr, i: tir.PrimExpr) -> tir.PrimExpr:
        word = packed[o, i // ELEMS_PER_WORD]
        shift = (i % ELEMS_PER_WORD * _BITS).astype("uint32")
        nibble = tir.bitwise_and(tir.shift_right(word, shift), tir.const(_MASK, "uint32"))
        value = nibble.astype(dtype) - tir.const(ZERO_POINT, dtype)
        return value * scale[o, i // GROUP_SIZE]

    return te.compute(shape, element, name="dequantize")


# --- the decoder block ------------------------------------------------------------------------


def _generated_weight(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    # Roughly a trained layer's spread (std 1 / sqrt(in)): activations stay in float16's range.
    return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float16)


def _projection(
    bb: relax.BlockBuilder, x: relax.Expr, packed: np.ndarray, scale: np.ndarray, name: str
) -> relax.Var:
    """``x @ dequantize(packed, scale).T`` as MLC emits it: call_tir -> permute_dims -> matmul."""
    weight = bb.emit(
        bb.call_te(
            dequantize_q4f16_1_te,
            relax.const(packed),
            relax.const(scale),
            primfunc_name_hint="dequantize",
        ),
        name_hint=f"{name}_weight",
    )
    transposed = bb.emit(relax.op.permute_dims(weight), name_hint=f"{name}_weight_t")
    return bb.emit(relax.op.matmul(x, transposed), name_hint=f"{name}_proj")


def build_decoder_block(
    hidden: int = 256,
    intermediate: int = 704,
    heads: int = 4,
    tokens: int = 4,
    seed: int = 0,
    layers: int = 1,
) -> tvm.IRModule:
    """A Llama-style decoder layer in float16 with q4f16_1 weights bound as constants.

    ``x (tokens, hidden) -> rms_norm -> q / k / v -> attention over the tokens (no KV cache, no
    mask: the block's prompt attends to itself) -> o -> residual -> rms_norm -> silu(gate) * up ->
    down -> residual``; each of the seven projections is
    ``call_tir(dequantize, (R.const(packed uint32), R.const(scale float16))) -> permute_dims ->
    matmul``, bound as ``<name>_proj`` (``l<i>.<name>_proj`` with several ``layers``, each with
    weights of its own). The weights are generated from ``seed``: the same bytes on every call.
    ``hidden`` and ``intermediate`` must be multiples of 32 and ``hidden`` of ``heads``; a 7B
    model's layer is ``hidden=4096, intermediate=11008, heads=32``.
    """
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}")
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((tokens, hidden), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for layer in range(layers):
                prefix = f"l{layer}." if layers > 1 else ""
                h = _decoder_layer(bb, h, rng, intermediate, heads, prefix)
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def _decoder_layer(
    bb: relax.BlockBuilder,
    x: relax.Expr,
    rng: np.random.Generator,
    intermediate: int,
    heads: int,
    prefix: str,
) -> relax.Var:
    tokens, hidden = (int(dim) for dim in x.ty.shape)
    head_dim = hidden // heads
    weights: Dict[str, Tuple[np.ndarray, np.ndarray]] = {
        p.name: quantize_q4f16_1(_generated_weight(rng, p.out_features, p.in_features))
        for p in decoder_projections(hidden, intermediate)
    }
    norm_in = (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float16)
    norm_post = (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float16)

    def project(t: relax.Expr, name: str) -> relax.Var:
        return _projection(bb, t, *weights.pop(name), prefix + name)  # pop: free the NumPy copy

    def heads_first(t: relax.Expr) -> relax.Var:
        split = bb.emit(relax.op.reshape(t, (tokens, heads, head_dim)))
        return bb.emit(relax.op.permute_dims(split, [1, 0, 2]))

    h = bb.emit(relax.op.nn.rms_norm(x, relax.const(norm_in), axes=[-1]))
    q, k, v = (project(h, name) for name in ("q", "k", "v"))
    qh, kh, vh = heads_first(q), heads_first(k), heads_first(v)
    scores = bb.emit(relax.op.matmul(qh, relax.op.permute_dims(kh, [0, 2, 1])))
    scaled = bb.emit(relax.op.multiply(scores, relax.const(1.0 / np.sqrt(head_dim), "float16")))
    probs = bb.emit(relax.op.nn.softmax(scaled, axis=-1))
    ctx = bb.emit(relax.op.matmul(probs, vh))
    merged = bb.emit(relax.op.reshape(relax.op.permute_dims(ctx, [1, 0, 2]), (tokens, hidden)))
    h1 = bb.emit(relax.op.add(x, project(merged, "o")))
    h2 = bb.emit(relax.op.nn.rms_norm(h1, relax.const(norm_post), axes=[-1]))
    gate, up = project(h2, "gate"), project(h2, "up")
    act = bb.emit(relax.op.multiply(relax.op.nn.silu(gate), up))
    return bb.emit(relax.op.add(h1, project(act, "down")))


def block_inputs(mod: tvm.IRModule, seed: int = 1) -> List[np.ndarray]:
    """Generated inputs for ``mod["main"]`` (float16 in [-1, 1)), one per parameter."""
    rng = np.random.default_rng(seed)
    arrays = []
    for param in mod["main"].params:
        shape = [int(dim) for dim in param.ty.shape]
        arrays.append(rng.uniform(-1, 1, shape).astype(str(param.ty.dtype)))
    return arrays


# --- TVM's CUTLASS-style flow: encode / decode with the weight as a parameter ------------------


def encode_int8(weight: np.ndarray, bits: int = 8) -> Tuple[np.ndarray, np.ndarray]:
    """NumPy reference of the ``encode`` kernel: ``(int8 weight, float16 scale (N,))`` of ``(K, N)``.

    Per output column ``n``: ``scale = max(max_k |W[k, n]|, 1e-4) / qmax`` (float32, stored as
    float16), ``q = clip(round(W / scale), -qmax - 1, qmax)`` with ``qmax`` 127 for 8 bits and 7
    for 4 bits. For 4 bits two values share one int8 along ``K`` (row ``2 r`` in the low nibble,
    ``2 r + 1`` in the high one): ``(K / 2, N)``.
    """
    qmax = (1 << (bits - 1)) - 1
    w = weight.astype(np.float32)
    scale32 = np.maximum(np.abs(w).max(axis=0), np.float32(1e-4)) / np.float32(qmax)
    q = np.clip(np.round(w / scale32), -qmax - 1, qmax).astype(np.int32)
    scale = scale32.astype(np.float16)
    if bits == 8:
        return q.astype(np.int8), scale
    low, high = q[0::2] & 0xF, q[1::2] & 0xF
    return ((high << 4) | low).astype(np.uint8).view(np.int8), scale


def decode_int8(packed: np.ndarray, scale: np.ndarray, bits: int = 8) -> np.ndarray:
    """NumPy reference of the ``decode`` kernel: the float16 ``(K, N)`` weight."""
    if bits == 8:
        q = packed.astype(np.float16)
    else:
        raw = packed.view(np.uint8).astype(np.int32)
        low, high = raw & 0xF, raw >> 4
        nibbles = np.empty((2 * raw.shape[0], raw.shape[1]), np.int32)
        nibbles[0::2], nibbles[1::2] = low, high
        q = np.where(nibbles >= 8, nibbles - 16, nibbles).astype(np.float16)
    return (q * scale[None, :]).astype(np.float16)


def _encode_te(weight: te.Tensor, bits: int) -> Tuple[te.Tensor, te.Tensor]:
    k_dim, n_dim = weight.shape
    qmax = float((1 << (bits - 1)) - 1)
    r = te.reduce_axis((0, k_dim), name="r")
    max_abs = te.compute(
        (n_dim,), lambda n: te.max(te.abs(weight[r, n].astype("float32")), axis=r), name="max_abs"
    )
    scale = te.compute(
        (n_dim,),
        lambda n: tir.max(max_abs[n], tir.const(1e-4, "float32")) / tir.const(qmax, "float32"),
        name="scale32",
    )

    def level(k: tir.PrimExpr, n: tir.PrimExpr) -> tir.PrimExpr:
        value = tir.round(weight[k, n].astype("float32") / scale[n])
        clipped = tir.min(
            tir.max(value, tir.const(-qmax - 1, "float32")), tir.const(qmax, "float32")
        )
        return clipped.astype("int32")

    if bits == 8:
        packed = te.compute((k_dim, n_dim), lambda k, n: level(k, n).astype("int8"), name="w_int8")
    else:
        packed = te.compute(
            (k_dim // 2, n_dim),
            lambda k, n: tir.bitwise_or(
                tir.bitwise_and(level(2 * k, n), 0xF),
                tir.shift_left(tir.bitwise_and(level(2 * k + 1, n), 0xF), 4),
            ).astype("int8"),
            name="w_int4x2",
        )
    scale16 = te.compute((n_dim,), lambda n: scale[n].astype("float16"), name="scale")
    return packed, scale16


def _decode_te(packed: te.Tensor, scale: te.Tensor, bits: int) -> te.Tensor:
    rows, n_dim = packed.shape
    if bits == 8:
        return te.compute(
            (rows, n_dim), lambda k, n: packed[k, n].astype("float16") * scale[n], name="decode"
        )

    def element(k: tir.PrimExpr, n: tir.PrimExpr) -> tir.PrimExpr:
        byte = packed[k // 2, n].astype("int32")
        # Arithmetic shifts sign-extend each nibble: high = byte >> 4, low = (byte << 28) >> 28.
        low = tir.shift_right(tir.shift_left(byte, 28), 28)
        high = tir.shift_right(byte, 4)
        return tir.Select(k % 2 == 0, low, high).astype("float16") * scale[n]

    return te.compute((rows * 2, n_dim), element, name="decode")


def build_cutlass_style_module(
    k: int = 64,
    n: int = 64,
    tokens: int = 4,
    bits: int = 8,
    *,
    hand_stops: bool = False,
    split_encode: bool = False,
) -> tvm.IRModule:
    """``main(x (tokens, k) fp16, w (k, n) fp16)`` with ``num_input=1``: encode -> decode -> matmul.

    ``encode`` (one kernel, two results: the int8 weight and its float16 scales) reads the weight
    parameter; ``decode`` reads both results; the matmul reads ``x`` and the decoded weight, as
    in TVM's ``test_fp16A_int8B_gemm`` / ``test_fp16A_int4B_gemm`` without their
    ``stop_lift_params`` (which they write by hand) and without the CUDA-only preprocessing.
    With ``hand_stops``, the decode's operands go through ``R.builtin.stop_lift_params`` as in
    those tests: the form ``LiftTransformParams`` keeps the decode in ``main`` for. With
    ``split_encode``, two kernels of one result each (``encode``: the int8 weight,
    ``encode_scale``: the scales) replace the one of two results, the same arithmetic.

    >>> mod = build_cutlass_style_module(bits=4)
    >>> sorted(str(gv.name_hint) for gv in mod.get_global_vars())
    ['decode', 'encode', 'main']
    """
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, not {bits}")
    if bits == 4 and k % 2:
        raise ValueError(f"k must be even for 4 bits, not {k}")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((tokens, k), "float16"))
    w = relax.Var("w", relax.TensorType((k, n), "float16"))
    with bb.function("main", [x, w], attrs={"num_input": 1}):
        with bb.dataflow():
            if split_encode:
                packed = bb.emit(
                    bb.call_te(lambda t: _encode_te(t, bits)[0], w, primfunc_name_hint="encode"),
                    name_hint="w_packed",
                )
                scale = bb.emit(
                    bb.call_te(
                        lambda t: _encode_te(t, bits)[1], w, primfunc_name_hint="encode_scale"
                    ),
                    name_hint="w_scale",
                )
            else:
                encoded = bb.emit(
                    bb.call_te(lambda t: _encode_te(t, bits), w, primfunc_name_hint="encode"),
                    name_hint="encoded",
                )
                packed = bb.emit(relax.TupleGetItem(encoded, 0), name_hint="w_packed")
                scale = bb.emit(relax.TupleGetItem(encoded, 1), name_hint="w_scale")
            if hand_stops:
                packed = bb.emit(relax.op.builtin.stop_lift_params(packed), name_hint="w_stop")
                scale = bb.emit(relax.op.builtin.stop_lift_params(scale), name_hint="s_stop")
            decoded = bb.emit(
                bb.call_te(
                    lambda p, s: _decode_te(p, s, bits), packed, scale, primfunc_name_hint="decode"
                ),
                name_hint="w_decoded",
            )
            out = bb.emit_output(relax.op.matmul(x, decoded, out_dtype="float16"))
        bb.emit_func_output(out)
    return bb.get()


# --- what the examples and tests count ---------------------------------------------------------


def kernel_calls(func: relax.Function, prefix: str) -> List[relax.Call]:
    """The ``call_tir`` calls in ``func`` whose PrimFunc's name starts with ``prefix``."""
    found: List[relax.Call] = []

    def visit(expr: relax.Expr) -> None:
        if (
            isinstance(expr, relax.Call)
            and isinstance(expr.op, tvm.ir.Op)
            and expr.op.name == "relax.call_tir"
            and str(expr.args[0].name_hint).startswith(prefix)
        ):
            found.append(expr)

    relax.analysis.post_order_visit(func, visit)
    return found


def dequantize_calls(mod: tvm.IRModule) -> List[relax.Call]:
    """``main``'s ``call_tir(dequantize*, (packed, scale))`` whose packed weight is a uint32 constant."""
    return [
        call
        for call in kernel_calls(mod["main"], "dequantize")
        if isinstance(call.args[1].fields[0], tvm.ir.GenericConst)
        and str(call.args[1].fields[0].ty.dtype) == "uint32"
    ]


def constant_bytes(mod: tvm.IRModule) -> int:
    """The bytes of every distinct constant in the module's Relax functions."""
    seen: Dict[int, int] = {}

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, tvm.ir.GenericConst):
            # keyed by the object's handle: Python wrappers are made afresh on every visit
            seen.setdefault(expr.__chandle__(), expr.value.numpy().nbytes)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return sum(seen.values())
