"""The Relay examples run as their docstrings say, and print what they claim.

Each example runs as ``__main__`` in this interpreter (the Relay environment), from the repository
root (``support.inprocess.run_example``: no subprocess paying seconds to import TVM again); the
assertions read the numbers it prints. The model is the QDQ CNN
of ``onnx_models.make_qdq_cnn(0, float_weights=True)``: 4 convolutions and 1 dense, so 5 weights.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Tuple

import pytest
from support import inprocess

ROOT = Path(__file__).resolve().parents[2]
#: qnn.conv2d + qnn.dense in the QDQ CNN after FakeQuantizationToInteger (its 5 weights).
N_QUANTIZED = 5


def run_example(name: str) -> str:
    return inprocess.run_example(ROOT / "examples" / name)


def line_with(stdout: str, prefix: str) -> str:
    """The one printed line that starts with ``prefix``."""
    lines = [line for line in stdout.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, f"expected one line starting {prefix!r} in:\n{stdout}"
    return lines[0]


@pytest.mark.slow
def test_fq2i_post_step_folds_exactly_the_weight_quantizes() -> None:
    stdout = run_example("fq2i_post_step.py")
    assert f"after FakeQuantizationToInteger: {N_QUANTIZED} quantized convs/denses" in stdout
    assert (
        f"allow_constant_qnn wrapped {N_QUANTIZED} constant QNN subgraphs in fold_allow" in stdout
    )
    rows: Dict[str, Tuple[int, int, int]] = {
        match.group(1): (int(match.group(2)), int(match.group(3)), int(match.group(4)))
        for match in re.finditer(
            r"^(FQ2I output \(no fold\)|stock FoldConstant\(\)|stock FoldConstant\(fold_qnn=True\)|"
            r"fold_guard allow_constant_qnn\+FoldConstant\(\))\s+(\d+)\s+(\d+) of (\d+)\s+(?:-|[\d.]+ s)$",
            stdout,
            re.M,
        )
    }
    n = N_QUANTIZED
    # (qnn.quantize of constants left, quantized ops with an int8 constant weight, of how many)
    assert rows == {
        "FQ2I output (no fold)": (n, 0, n),
        "stock FoldConstant()": (n, 0, n),
        "stock FoldConstant(fold_qnn=True)": (0, n, n),
        "fold_guard allow_constant_qnn+FoldConstant()": (0, n, n),
    }, stdout
    # Exactly the annotated quantizes folded (with their annotations), nothing else constant kept.
    assert f"folded: {n} fold_allow, {n} qnn.quantize; constant but kept: nothing" in stdout
    assert "fold_guard's module equals stock fold_qnn=True's" in stdout
    assert line_with(stdout, "fold_guard's module vs the unfolded module:").endswith(": identical")
    assert line_with(stdout, "fold_guard's module vs onnxruntime:").endswith(": ok")


@pytest.mark.slow
def test_relay_backend_partition_offloads_every_quantized_op_only_after_a_weight_fold() -> None:
    stdout = run_example("relay_backend_partition.py")
    assert f"after FakeQuantizationToInteger: {N_QUANTIZED} quantized convs/denses" in stdout
    rows: Dict[str, Tuple[int, int, int]] = {
        match.group(1): (int(match.group(2)), int(match.group(3)), int(match.group(4)))
        for match in re.finditer(
            r"^(stock FoldConstant\(\)|stock FoldConstant\(fold_qnn=True\)"
            r"|fold_guard FoldConstant\('qdq-accelerator'\))"
            r"\s+[\d.]+ s\s+(\d+) of (\d+)\s+(\d+)$",
            stdout,
            re.M,
        )
    }
    n = N_QUANTIZED
    # (offloaded with an int8 constant weight, of how many, external functions)
    assert rows == {
        "stock FoldConstant()": (0, n, 0),
        "stock FoldConstant(fold_qnn=True)": (n, n, n),
        "fold_guard FoldConstant('qdq-accelerator')": (n, n, n),
    }, stdout
    assert "fold plan under policy 'qdq-accelerator':" in stdout
    assert f"folded: {n} x qnn.quantize; constant but kept: 0" in stdout
    # Partition first: every quantized op offloaded, none with a ready weight until the codegen folds.
    assert (
        f"partitioned before folding: {n} of {n} quantized convs/denses offloaded, 0 with an int8 constant weight"
        in stdout
    )
    assert (
        f"the codegen folded {n} external functions with fold_function: {n} of {n} offloaded"
        in stdout
    )
    assert line_with(stdout, "partitioned module vs the unfolded module:").endswith(": identical")
    assert line_with(stdout, "partitioned module vs onnxruntime:").endswith(": ok")
