"""What a lowered call computes, read from its kernel's name: the one list, with where each comes from.

A lowered call (Relax ``call_tir`` of a PrimFunc, as ``LegalizeOps``, MLC-LLM's quantizers and
TVM's CUTLASS flow emit) no longer names its op: ``call.op`` is ``relax.call_tir``. The passes
that need to know what such a call computes (the fusions that make quantized LLMs fast) read the
PrimFunc's name, and so do the built-in policies, through this table. Names get a numeric suffix
when a module holds several kernels of one name (``dequantize1``), so every entry matches a
prefix or a substring, as the predicates it copies do.

:data:`KERNEL_NAMES` lists each name with the flow it comes from: ``LegalizeOps`` (``dequantize``,
``quantize``, ``cast``, ``conv2d``, ``matmul``, ``add``), MLC-LLM's quantizers and
``FuseDequantize*`` passes (``dequantize*``), TVM's CUTLASS flow and ``cutlass.decode_matmul``
patterns (``encode``, ``decode``), Adreno CLML's ``dequant_matmul`` check (``dequantize``).

Dequantize is tried before quantize, so ``dequantize`` is never read as a quantize. A role says
what a kernel computes, not what a policy does with it: the rules still check the operands
(an integer constant for a dequantize, float constants for a quantize).

>>> kernel_role("dequantize3"), kernel_role("fused_decode1"), kernel_role("quantize")
('dequantize', 'dequantize', 'quantize')
>>> kernel_role("maximum") is None
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

__all__ = [
    "ADD",
    "CAST",
    "DEQUANTIZE",
    "KERNEL_NAMES",
    "QUANTIZE",
    "WEIGHT",
    "KernelName",
    "kernel_role",
]

DEQUANTIZE = "dequantize"
QUANTIZE = "quantize"
CAST = "cast"
WEIGHT = "weight"
ADD = "add"


@dataclass(frozen=True)
class KernelName:
    """One way a flow names a kernel of ``role``: ``text`` as a ``prefix`` or anywhere in the name."""

    role: str
    text: str
    prefix: bool
    source: str

    def matches(self, name: str) -> bool:
        return name.startswith(self.text) if self.prefix else self.text in name


#: Every kernel name the built-in policies recognise, in the order they are tried.
KERNEL_NAMES: Tuple[KernelName, ...] = (
    KernelName(
        DEQUANTIZE,
        "dequantize",
        True,
        "LegalizeOps of relax.dequantize (legalize_ops/qdq.py, primfunc_name_hint='dequantize'); "
        "MLC-LLM GroupQuantize / AWQ / FTQuantize (nn.op.tensor_expr_op(..., "
        "name_hint='dequantize')) and its FuseDequantizeMatmulEwise / FuseDequantizeTake / "
        "FuseDequantizeTranspose checks (name_hint.startswith('dequantize'))",
    ),
    KernelName(
        DEQUANTIZE,
        "dequantize",
        False,
        "TVM Adreno CLML openclml.dequant_matmul check ('dequantize' in name_hint, "
        "python/tvm/relax/backend/adreno/clml.py)",
    ),
    KernelName(
        DEQUANTIZE,
        "decode",
        False,
        "TVM cutlass.decode_matmul* patterns ('decode' in name_hint, int8 packed weight, "
        "python/tvm/relax/backend/cuda/cutlass.py); MLC-LLM's earlier uint32 'decode' kernels",
    ),
    KernelName(
        QUANTIZE,
        "quantize",
        True,
        "LegalizeOps of relax.quantize (legalize_ops/qdq.py, primfunc_name_hint='quantize')",
    ),
    KernelName(
        QUANTIZE,
        "encode",
        False,
        "TVM's CUTLASS flow: encode -> stop_lift_params -> decode "
        "(tests/python/relax/test_codegen_cutlass.py)",
    ),
    KernelName(
        CAST, "cast", True, "LegalizeOps of relax.astype (legalize_ops/datatype.py: topi.cast)"
    ),
    KernelName(WEIGHT, "conv", True, "LegalizeOps of relax.nn.conv1d / 2d / 3d (topi names)"),
    KernelName(
        WEIGHT, "matmul", True, "LegalizeOps of relax.matmul; MLC-LLM _check_matmul ('matmul')"
    ),
    KernelName(WEIGHT, "NT_matmul", True, "MLC-LLM _check_matmul ('NT_matmul')"),
    KernelName(WEIGHT, "dense", True, "topi.nn.dense"),
    KernelName(ADD, "add", True, "LegalizeOps of relax.add (topi.add)"),
)


def kernel_role(name: str) -> Optional[str]:
    """The role of a kernel called ``name`` (a PrimFunc's name), or None when no entry matches."""
    for entry in KERNEL_NAMES:
        if entry.matches(name):
            return entry.role
    return None
