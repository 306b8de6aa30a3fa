"""The built-in example runs as the README says, and prints what it claims."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# Each test runs an example script end to end (tens of seconds): full lane only.
pytestmark = pytest.mark.slow


def test_qdq_example_keeps_weight_patterns_and_matches_onnxruntime() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "qdq_cnn.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    rows = {
        match.group(1).strip(): (int(match.group(2)), int(match.group(3)), match.group(4))
        for match in re.finditer(
            r"^(imported|stock FoldConstant|fold_guard keep-qdq-weights)\s+(\d+)\s+(\d+)\s+\S+ \((.*)\)$",
            result.stdout,
            re.M,
        )
    }
    # imported: 5 quantize(fp32 weight const); 5 dequantize(int32 bias const)
    assert rows["imported"][:2] == (5, 5)
    # stock folds all of them, dequantize included
    assert rows["stock FoldConstant"][:2] == (0, 0)
    # ours: the 5 weights became int8 constants, so 5 weight + 5 bias dequantize(const) remain
    assert rows["fold_guard keep-qdq-weights"][:2] == (0, 10)
    assert all(status == "ok" for _, _, status in rows.values()), rows
    assert "kept by policy [keep-dequantize-of-integer-constant]" in result.stdout


def _run_example(name: str) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_frontend_annotation_example_keeps_every_weight_pattern_through_stock_folding() -> None:
    out = _run_example("frontend_annotation.py")
    rows = {
        (match.group(1), match.group(2)): (int(match.group(3)), int(match.group(4)), match.group(5))
        for match in re.finditer(
            r"^(\w+)\s+(imported|stock FoldConstant|annotated, stock FoldConstant)\s+(\d+)\s+(\d+)\s+\S+ \((\w+)\)$",
            out,
            re.M,
        )
    }
    models = {model for model, _ in rows}
    assert models == {"qdq_cnn", "residual_cnn", "transformer_block"}, out
    for model in models:
        weights, biases = rows[model, "imported"][
            :2
        ]  # quantize(fp32 weight), dequantize(int32 bias)
        assert weights > 0
        # stock folding leaves no Q/DQ pattern at all
        assert rows[model, "stock FoldConstant"][:2] == (0, 0)
        # annotated first: weights became int8 constants, every weight and bias dequantize stays
        assert rows[model, "annotated, stock FoldConstant"][:2] == (0, weights + biases)
        assert all(status == "ok" for (m, _), (*_, status) in rows.items() if m == model)
    placed_counts = [int(n) for n in re.findall(r"annotate placed (\d+) fold_barrier", out)]
    assert placed_counts == [
        rows[m, "annotated, stock FoldConstant"][1]
        for m in ("qdq_cnn", "residual_cnn", "transformer_block")
    ]
    assert out.rstrip().endswith("ok")


def test_backend_partition_example_offloads_every_quantized_op_only_after_fold_guard() -> None:
    out = _run_example("backend_partition.py")
    paths = ("imported (not folded)", "stock FoldConstant", "fold_guard qdq-accelerator")
    rows = {
        (match.group(1), match.group(2)): (
            int(match.group(3)),
            int(match.group(4)),
            int(match.group(5)),
        )
        for match in re.finditer(
            r"^(\w+)\s+(" + "|".join(re.escape(p) for p in paths) + r")\s+(\d+) / (\d+)\s+(\d+) B",
            out,
            re.M,
        )
    }
    # Quantized convs + matmuls per model: 4 Conv + Gemm; 6 Conv + Gemm; 6 MatMul with weights.
    totals = {"qdq_cnn": 5, "residual_cnn": 7, "transformer_block": 6}
    assert set(rows) == {(model, path) for model in totals for path in paths}, out
    for model, total in totals.items():
        imported, stock, ours = (rows[model, path] for path in paths)
        assert imported[1] == stock[1] == ours[1] == total
        # weights stored in float are no int8 constants before folding; stock folds them to fp32
        assert imported[0] == 0 and stock[0] == 0
        # fold_guard folds quantize into int8 weights and keeps the dequantize: all offloaded
        assert ours[0] == total
        assert ours[2] < stock[2]  # int8 weights instead of fp32 ones
    plans = re.findall(r"^(\w+): fold plan under policy 'qdq-accelerator': (\d+) folded", out, re.M)
    assert {model for model, _ in plans} == set(totals) and all(int(n) > 0 for _, n in plans), out
    checks = re.findall(r"^(\w+)\s+partitioned vs unfolded: bit-identical; .*: ok$", out, re.M)
    assert sorted(checks) == sorted(totals), out
