"""The IR op names the built-in policies read: one table per adapter, and nowhere else in the core.

A built-in policy asks IR-neutral questions of a call: is it a quantize, a dequantize, a
requantize, a dtype cast, a quantized compute op (what Relay's ``fold_qnn`` is about), a weight op
(convolution, dense, matmul), a bias op? Each adapter's IR answers them with its own op names,
listed in its table below; the planner and the policy code only ever ask :data:`OP_TABLES`.
Every name is an op the IR registers (a test checks each table against its TVM), so supporting a
new op, or another IR, is one entry here.

A table holds names, not TVM objects, so the core stays TVM-free: ``qnn.*`` names are Relay's and
``relax.*`` names Relax's, and a graph of either IR can be planned without its TVM installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, Tuple

__all__ = ["LIFT_STOP_OPS", "OP_TABLES", "RELAX_OP_NAMES", "RELAY_OP_NAMES", "IROpNames"]


@dataclass(frozen=True)
class IROpNames:
    """What the built-in policies need to know about one IR's ops.

    ``quantized_prefix`` marks the IR's quantized op family (Relay's ``qnn.``; Relax has none:
    its quantized models are ``quantize`` / ``dequantize`` around float ops). ``requantize`` ops
    change an integer tensor's scale in one call (Relay's ``qnn.requantize``, which
    ``FakeQuantizationToInteger`` makes of a ``dequantize -> quantize`` pair; Relax has none).
    ``cast`` ops change a tensor's dtype and nothing else. ``bias_add`` ops take the bias as a
    later operand; ``add`` ops add a bias when their other operand comes from a weight op.
    ``lift_stop`` is the identity op the IR's parameter lifting never lifts (Relax
    ``stop_lift_params``; Relay has no parameter lifting).
    """

    ir: str
    quantize: FrozenSet[str]
    dequantize: FrozenSet[str]
    weight: FrozenSet[str]
    bias_add: FrozenSet[str]
    add: FrozenSet[str]
    cast: FrozenSet[str] = frozenset()
    requantize: FrozenSet[str] = frozenset()
    quantized_prefix: str = ""
    lift_stop: FrozenSet[str] = frozenset()

    def is_quantized_op(self, op: str) -> bool:
        """Whether ``op`` belongs to the IR's quantized op family (quantize and dequantize included)."""
        return bool(self.quantized_prefix) and op.startswith(self.quantized_prefix)


RELAX_OP_NAMES = IROpNames(
    ir="relax",
    quantize=frozenset({"relax.quantize"}),
    dequantize=frozenset({"relax.dequantize"}),
    weight=frozenset(
        {
            "relax.matmul",
            "relax.nn.conv1d",
            "relax.nn.conv2d",
            "relax.nn.conv3d",
            "relax.nn.conv1d_transpose",
            "relax.nn.conv2d_transpose",
            "relax.nn.conv3d_transpose",
        }
    ),
    bias_add=frozenset(),
    add=frozenset({"relax.add"}),
    cast=frozenset({"relax.astype"}),
    lift_stop=frozenset({"relax.builtin.stop_lift_params"}),
)

RELAY_OP_NAMES = IROpNames(
    ir="relay",
    quantize=frozenset({"qnn.quantize"}),
    dequantize=frozenset({"qnn.dequantize"}),
    weight=frozenset(
        {
            "nn.conv1d",
            "nn.conv2d",
            "nn.conv3d",
            "nn.conv1d_transpose",
            "nn.conv2d_transpose",
            "nn.conv3d_transpose",
            "nn.contrib_conv2d_NCHWc",
            "nn.contrib_depthwise_conv2d_NCHWc",
            "nn.dense",
            "nn.contrib_dense_pack",
            "nn.matmul",
            "nn.batch_matmul",
            "qnn.conv2d",
            "qnn.conv2d_transpose",
            "qnn.dense",
            "qnn.contrib_dense_pack",
            "qnn.batch_matmul",
        }
    ),
    bias_add=frozenset({"nn.bias_add"}),
    add=frozenset({"add", "qnn.add"}),
    cast=frozenset({"cast"}),
    requantize=frozenset({"qnn.requantize"}),
    quantized_prefix="qnn.",
)

#: Every adapter's table; the built-in policies read their union.
OP_TABLES: Tuple[IROpNames, ...] = (RELAX_OP_NAMES, RELAY_OP_NAMES)
#: The ops every IR's parameter lifting leaves at run time (see :attr:`IROpNames.lift_stop`).
LIFT_STOP_OPS: FrozenSet[str] = frozenset(name for table in OP_TABLES for name in table.lift_stop)
