"""The Relax table of op names the built-in policies read names only ops Relax registers.

White-box on purpose: it tests the core's table of Relax op names (``_core.op_names``), a private
mechanism.
"""

import pytest
import tvm

import fold_guard.relax  # noqa: F401 - the adapter's TVM
from fold_guard._core.op_names import RELAX_OP_NAMES


@pytest.mark.parametrize(
    "name",
    sorted(
        RELAX_OP_NAMES.quantize
        | RELAX_OP_NAMES.dequantize
        | RELAX_OP_NAMES.weight
        | RELAX_OP_NAMES.bias_add
        | RELAX_OP_NAMES.add
        | RELAX_OP_NAMES.lift_stop
        | RELAX_OP_NAMES.cast
        | RELAX_OP_NAMES.requantize
    ),
)
def test_every_name_is_a_registered_relax_op(name: str) -> None:
    assert tvm.ir.Op.get(name).name == name
