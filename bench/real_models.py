"""ONNX graphs with the layer shapes of five public architectures, quantized by onnxruntime.

The benchmarks need models whose folding work looks like a real network's: the same number of
layers, the same weight shapes (so the same number of distinct kernel signatures) and the same
weight bytes. The graphs are written with ``onnx.helper`` from fixed-seed random weights, so
nothing is downloaded and no torch / torchvision is needed (torchvision from the registry does
not import beside the CPU torch these machines have). Batch normalisation is already fused into
each convolution's weight and bias, as the TorchScript ``torch.onnx.export`` leaves an eval-mode
model; dropout is absent, as in any inference export.

- ``resnet50``: torchvision ResNet-50 (v1.5: stride on the 3x3 conv of a bottleneck), 53
  ``Conv`` + 1 ``Gemm`` (25.5 M parameters, batch norm fused).
- ``mobilenet_v2``: torchvision MobileNetV2 (width 1.0), 52 ``Conv`` (17 depthwise, ``Clip``
  as ReLU6) + 1 ``Gemm``.
- ``efficientnet_b0``: torchvision EfficientNet-B0, 81 ``Conv`` (16 depthwise, squeeze-excite
  1x1 convs with bias, SiLU as ``Sigmoid`` + ``Mul``) + 1 ``Gemm``.
- ``vit_small``: ViT-S/16 (12 pre-norm layers, width 384, 6 heads, MLP 1536), patch-embedding
  ``Conv``, class token, position embedding, 73 ``Gemm`` in all.
- ``bert_tiny``: BERT-tiny (2 post-norm layers, hidden 128, 2 heads, intermediate 512, vocab
  30522, 512 positions) on a sequence of 128 token ids, with the pooler; the position and
  token-type embeddings are gathered with constant indices, as a torch export leaves them.

Images are (1, 3, 64, 64) so the input size does not dominate; the weights are full size.
Attention works on the (sequence, width) matrix with ``Gemm`` projections, as
``_common.onnx_models.float_transformer_block`` does; there is no attention mask.

Every model is quantized by the project's one ``quantize_static`` helper
(``_common.onnx_models._quantize_qdq``: QDQ, per-channel int8 weights, MinMax
calibration), in the two forms a frontend meets: ``int8`` (weights stored as int8 initializers
behind ``DequantizeLinear``) and ``float_weights`` (fp32 weights feeding ``QuantizeLinear ->
DequantizeLinear``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Sequence, Tuple

import numpy as np

if TYPE_CHECKING:  # pragma: no cover - typing only
    import onnx

__all__ = ["FORMS", "MODELS", "ModelSpec", "build_float", "build_quantized", "model_stats"]

#: The two quantized forms: int8 weight initializers, or fp32 weights feeding QuantizeLinear.
FORMS = ("int8", "float_weights")
IMAGE_SHAPE = (1, 3, 64, 64)
NUM_CLASSES = 1000
#: Calibration batches per model: MinMax needs only a few, and quantize_static's run of the
#: float model is the slowest part of building ResNet-50.
CALIBRATION_SAMPLES = 2
#: Ops that carry a layer's weight, for the layer count.
WEIGHT_OPS = ("Conv", "Gemm", "MatMul", "Gather")


class _Graph:
    """A float32 ONNX graph under construction: nodes, initializers and fresh names."""

    def __init__(self, seed: int, scale: int = 1) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: List[onnx.NodeProto] = []
        self.initializers: List[onnx.TensorProto] = []
        self._count = 0
        #: divides every channel width (the smoke test's tiny models); 1 for the real shapes
        self.scale = scale

    def width(self, channels: int) -> int:
        return max(1, channels // self.scale)

    def name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def const(self, prefix: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.name(prefix)
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def weight(self, prefix: str, shape: Tuple[int, ...], fan_in: int) -> str:
        # He-style initialisation keeps activations (and so the calibrated scales) sensible.
        return self.const(
            prefix, (self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        )

    def bias(self, prefix: str, size: int) -> str:
        return self.const(prefix, (self.rng.standard_normal(size) * 0.1).astype(np.float32))

    def node(self, op: str, inputs: Sequence[str], **attrs) -> str:
        from onnx import helper

        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return out

    # ------------------------------------------------------------------ layers

    def conv(
        self, x: str, cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1
    ) -> str:
        w = self.weight(
            "conv_w", (cout, cin // groups, kernel, kernel), cin // groups * kernel * kernel
        )
        pad = kernel // 2
        return self.node(
            "Conv",
            [x, w, self.bias("conv_b", cout)],
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad] * 4,
            group=groups,
        )

    def act(self, x: str, kind: str) -> str:
        if kind == "relu":
            return self.node("Relu", [x])
        if kind == "relu6":
            lo = self.const("clip_min", np.array(0.0, np.float32))
            hi = self.const("clip_max", np.array(6.0, np.float32))
            return self.node("Clip", [x, lo, hi])
        if kind == "silu":  # torch.onnx exports nn.SiLU as x * sigmoid(x)
            return self.node("Mul", [x, self.node("Sigmoid", [x])])
        raise ValueError(kind)

    def linear(self, x: str, cin: int, cout: int) -> str:
        # (out, in) with transB=1, as torch.nn.Linear exports
        w = self.weight("fc_w", (cout, cin), cin)
        return self.node("Gemm", [x, w, self.bias("fc_b", cout)], transB=1)

    def classifier(self, x: str, channels: int) -> str:
        pooled = self.node("Flatten", [self.node("GlobalAveragePool", [x])], axis=1)
        return self.linear(pooled, channels, NUM_CLASSES)

    def layer_norm(self, x: str, width: int) -> str:
        gamma = self.const(
            "ln_scale", (1.0 + self.rng.standard_normal(width) * 0.1).astype(np.float32)
        )
        return self.node(
            "LayerNormalization", [x, gamma, self.bias("ln_bias", width)], axis=-1, epsilon=1e-5
        )

    def shape(self, dims: Sequence[int]) -> str:
        return self.const("shape", np.array(dims, np.int64))

    def attention(self, x: str, seq: int, width: int, heads: int) -> str:
        head = width // heads
        split = self.shape([seq, heads, head])
        parts = {}
        for part, perm in (("q", [1, 0, 2]), ("k", [1, 2, 0]), ("v", [1, 0, 2])):
            y = self.node("Reshape", [self.linear(x, width, width), split])
            parts[part] = self.node("Transpose", [y], perm=perm)
        scores = self.node("MatMul", [parts["q"], parts["k"]])
        scaled = self.node(
            "Mul", [scores, self.const("attn_scale", np.array(1.0 / np.sqrt(head), np.float32))]
        )
        ctx = self.node("MatMul", [self.node("Softmax", [scaled], axis=-1), parts["v"]])
        ctx = self.node(
            "Reshape", [self.node("Transpose", [ctx], perm=[1, 0, 2]), self.shape([seq, width])]
        )
        return self.linear(ctx, width, width)

    def mlp(self, x: str, width: int, hidden: int) -> str:
        y = self.node("Gelu", [self.linear(x, width, hidden)], approximate="none")
        return self.linear(y, hidden, width)

    def encoder_layer(
        self, x: str, seq: int, width: int, heads: int, hidden: int, pre_norm: bool
    ) -> str:
        if pre_norm:  # ViT: x + f(LN(x))
            x = self.node("Add", [x, self.attention(self.layer_norm(x, width), seq, width, heads)])
            return self.node("Add", [x, self.mlp(self.layer_norm(x, width), width, hidden)])
        # BERT: LN(x + f(x))
        x = self.layer_norm(self.node("Add", [x, self.attention(x, seq, width, heads)]), width)
        return self.layer_norm(self.node("Add", [x, self.mlp(x, width, hidden)]), width)

    def finish(
        self,
        name: str,
        inputs: Dict[str, Tuple[Tuple[int, ...], int]],
        output: str,
        output_shape: Tuple[int, ...],
    ) -> onnx.ModelProto:
        import onnx
        from onnx import TensorProto, helper

        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info(n, elem, list(s)) for n, (s, elem) in inputs.items()],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, list(output_shape))],
            self.initializers,
        )
        # opset 20 for ONNX's Gelu; IR version 9 is the lowest that admits it and below what
        # onnxruntime 1.32 accepts (the default follows the installed onnx).
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 20)], producer_name="fold_guard"
        )
        model.ir_version = 9
        onnx.checker.check_model(model)
        return model


def _image_input() -> Dict[str, Tuple[Tuple[int, ...], int]]:
    from onnx import TensorProto

    return {"input": (IMAGE_SHAPE, TensorProto.FLOAT)}


def _resnet50(g: _Graph) -> onnx.ModelProto:
    x = g.act(g.conv("input", 3, g.width(64), 7, 2), "relu")
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = g.width(64)
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        width = g.width(width)
        for b in range(blocks):
            s = stride if b == 0 else 1
            y = g.act(g.conv(x, cin, width, 1), "relu")
            y = g.act(g.conv(y, width, width, 3, s), "relu")
            y = g.conv(y, width, 4 * width, 1)
            shortcut = g.conv(x, cin, 4 * width, 1, s) if b == 0 else x
            x = g.act(g.node("Add", [y, shortcut]), "relu")
            cin = 4 * width
    return g.finish("resnet50", _image_input(), g.classifier(x, cin), (1, NUM_CLASSES))


#: (expansion, kernel, first stride, channels, repeats) of each stage of torchvision's models.
_MOBILENET_V2_STAGES = (
    (1, 3, 1, 16, 1),
    (6, 3, 2, 24, 2),
    (6, 3, 2, 32, 3),
    (6, 3, 2, 64, 4),
    (6, 3, 1, 96, 3),
    (6, 3, 2, 160, 3),
    (6, 3, 1, 320, 1),
)
_EFFICIENTNET_B0_STAGES = (
    (1, 3, 1, 16, 1),
    (6, 3, 2, 24, 2),
    (6, 5, 2, 40, 2),
    (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3),
    (6, 5, 2, 192, 4),
    (6, 3, 1, 320, 1),
)


def _inverted_residual_net(
    g: _Graph, name: str, stages, act: str, squeeze_excite: bool
) -> onnx.ModelProto:
    """MobileNetV2 / EfficientNet-B0: stem, inverted residual blocks, 1x1 head to 1280, classifier.

    A block: 1x1 expansion (absent at expansion 1), depthwise kxk, optionally squeeze-excite
    (EfficientNet: to a quarter of the block's input channels, SiLU, back, Sigmoid gate), 1x1
    linear projection, and a residual add where the shape allows.
    """
    cin = g.width(32)
    x = g.act(g.conv("input", 3, cin, 3, 2), act)
    for e, k, s, c, n in stages:
        cout = g.width(c)
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * e
            y = g.act(g.conv(x, cin, hidden, 1), act) if e != 1 else x
            y = g.act(g.conv(y, hidden, hidden, k, stride, groups=hidden), act)
            if squeeze_excite:
                squeeze = max(1, cin // 4)
                se = g.act(g.conv(g.node("GlobalAveragePool", [y]), hidden, squeeze, 1), "silu")
                y = g.node("Mul", [y, g.node("Sigmoid", [g.conv(se, squeeze, hidden, 1)])])
            y = g.conv(y, hidden, cout, 1)
            x = g.node("Add", [x, y]) if stride == 1 and cin == cout else y
            cin = cout
    last = g.width(1280)
    x = g.act(g.conv(x, cin, last, 1), act)
    return g.finish(name, _image_input(), g.classifier(x, last), (1, NUM_CLASSES))


def _mobilenet_v2(g: _Graph) -> onnx.ModelProto:
    return _inverted_residual_net(
        g, "mobilenet_v2", _MOBILENET_V2_STAGES, "relu6", squeeze_excite=False
    )


def _efficientnet_b0(g: _Graph) -> onnx.ModelProto:
    return _inverted_residual_net(
        g, "efficientnet_b0", _EFFICIENTNET_B0_STAGES, "silu", squeeze_excite=True
    )


def _vit_small(g: _Graph) -> onnx.ModelProto:
    width, heads, layers, patch = g.width(384), 6, 12, 16
    tokens = (IMAGE_SHAPE[2] // patch) * (IMAGE_SHAPE[3] // patch)
    seq = tokens + 1
    w = g.weight("patch_w", (width, 3, patch, patch), 3 * patch * patch)
    x = g.node(
        "Conv",
        ["input", w, g.bias("patch_b", width)],
        kernel_shape=[patch, patch],
        strides=[patch, patch],
    )
    x = g.node("Transpose", [g.node("Reshape", [x, g.shape([width, tokens])])], perm=[1, 0])
    cls = g.const("cls_token", (g.rng.standard_normal((1, width)) * 0.02).astype(np.float32))
    x = g.node("Concat", [cls, x], axis=0)
    x = g.node(
        "Add",
        [x, g.const("pos_embed", (g.rng.standard_normal((seq, width)) * 0.02).astype(np.float32))],
    )
    for _ in range(layers):
        x = g.encoder_layer(x, seq, width, heads, 4 * width, pre_norm=True)
    x = g.layer_norm(x, width)
    first = g.node("Gather", [x, g.const("cls_index", np.array([0], np.int64))], axis=0)
    return g.finish(
        "vit_small", _image_input(), g.linear(first, width, NUM_CLASSES), (1, NUM_CLASSES)
    )


BERT_SEQ = 128
BERT_VOCAB = 30522


def _bert_tiny(g: _Graph) -> onnx.ModelProto:
    from onnx import TensorProto

    width, heads, layers, hidden, positions = g.width(128), 2, 2, g.width(512), 512
    vocab = BERT_VOCAB // g.scale

    def table(rows: int) -> str:
        return g.const(
            "embedding", (g.rng.standard_normal((rows, width)) * 0.02).astype(np.float32)
        )

    ids = g.node("Reshape", ["input_ids", g.shape([BERT_SEQ])])
    x = g.node("Gather", [table(vocab), ids], axis=0)
    # a torch export gathers position and token-type rows with constant indices: constant subgraphs
    pos = g.node(
        "Gather",
        [table(positions), g.const("position_ids", np.arange(BERT_SEQ, dtype=np.int64))],
        axis=0,
    )
    typ = g.node(
        "Gather", [table(2), g.const("token_type_ids", np.zeros(BERT_SEQ, np.int64))], axis=0
    )
    x = g.layer_norm(g.node("Add", [g.node("Add", [x, pos]), typ]), width)
    for _ in range(layers):
        x = g.encoder_layer(x, BERT_SEQ, width, heads, hidden, pre_norm=False)
    first = g.node("Gather", [x, g.const("cls_index", np.array([0], np.int64))], axis=0)
    pooled = g.node("Tanh", [g.linear(first, width, width)])
    return g.finish(
        "bert_tiny", {"input_ids": ((1, BERT_SEQ), TensorProto.INT64)}, pooled, (1, width)
    )


@dataclass(frozen=True)
class ModelSpec:
    """A float model builder and how to make its calibration feeds."""

    build: Callable[[_Graph], onnx.ModelProto]
    feed: Callable[[np.random.Generator, int], Dict[str, np.ndarray]]


def _image_feed(rng: np.random.Generator, scale: int) -> Dict[str, np.ndarray]:
    return {"input": rng.standard_normal(IMAGE_SHAPE).astype(np.float32)}


def _ids_feed(rng: np.random.Generator, scale: int) -> Dict[str, np.ndarray]:
    return {"input_ids": rng.integers(0, BERT_VOCAB // scale, size=(1, BERT_SEQ), dtype=np.int64)}


MODELS: Dict[str, ModelSpec] = {
    "resnet50": ModelSpec(_resnet50, _image_feed),
    "mobilenet_v2": ModelSpec(_mobilenet_v2, _image_feed),
    "efficientnet_b0": ModelSpec(_efficientnet_b0, _image_feed),
    "vit_small": ModelSpec(_vit_small, _image_feed),
    "bert_tiny": ModelSpec(_bert_tiny, _ids_feed),
}


def build_float(name: str, seed: int = 0, *, scale: int = 1) -> onnx.ModelProto:
    """The float32 model ``name`` of :data:`MODELS`; ``scale`` > 1 divides every width (tests)."""
    return MODELS[name].build(_Graph(seed, scale))


def build_quantized(
    name: str,
    form: str,
    seed: int = 0,
    *,
    scale: int = 1,
    activation_type: str = "uint8",
    per_channel: bool = True,
) -> onnx.ModelProto:
    """``build_float(name)`` quantized by onnxruntime in ``form`` (one of :data:`FORMS`).

    By default uint8 activations and per-channel weight scales; ``activation_type="int8",
    per_channel=False`` gives the s8 per-tensor form CMSIS-NN and Arm Compute Library take.
    """
    # The project's one quantize_static call, so these models share every quantizer option with
    # the test models (a private helper of examples/_common/onnx_models.py; fine for a benchmark).
    from _common.onnx_models import _quantize_qdq

    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    rng = np.random.default_rng((seed, 1))
    calibration = [MODELS[name].feed(rng, scale) for _ in range(CALIBRATION_SAMPLES)]
    return _quantize_qdq(
        build_float(name, seed, scale=scale),
        calibration,
        activation_type=activation_type,
        float_weights=form == "float_weights",
        per_channel=per_channel,
    )


def model_stats(float_model: onnx.ModelProto) -> Dict[str, int]:
    """Weight layers (``Conv`` / ``Gemm`` / ``MatMul`` on an initializer, embedding ``Gather``),
    parameters and fp32 initializer bytes of a float model."""
    from onnx import numpy_helper

    arrays = {t.name: numpy_helper.to_array(t) for t in float_model.graph.initializer}
    layers = sum(
        1
        for n in float_model.graph.node
        if n.op_type in WEIGHT_OPS and any(i in arrays and arrays[i].ndim >= 2 for i in n.input)
    )
    float_arrays = [a for a in arrays.values() if a.dtype == np.float32]
    return {
        "layers": layers,
        "params": int(sum(a.size for a in float_arrays)),
        "weight_bytes": int(sum(a.nbytes for a in float_arrays)),
    }
