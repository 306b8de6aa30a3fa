"""The Relay table of op names the built-in policies read names only ops Relay registers.

White-box on purpose: it tests the core's table of Relay op names (``_core.op_names``), a private
mechanism.
"""

import pytest
import tvm

import fold_guard.relay  # noqa: F401 - the adapter's TVM
from fold_guard._core.op_names import RELAY_OP_NAMES


@pytest.mark.parametrize(
    "name",
    sorted(
        RELAY_OP_NAMES.quantize
        | RELAY_OP_NAMES.dequantize
        | RELAY_OP_NAMES.weight
        | RELAY_OP_NAMES.bias_add
        | RELAY_OP_NAMES.add
        | RELAY_OP_NAMES.cast
        | RELAY_OP_NAMES.requantize
    ),
)
def test_every_name_is_a_registered_relay_op(name: str) -> None:
    assert tvm.ir.Op.get(name).name == name
