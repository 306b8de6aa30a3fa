"""The built-in example runs as the README says, and prints what it claims; the output
examples/README.md shows for each script run here is what it prints today (timings aside).

``examples/qdq_cnn.py``, the README's command, runs as a user runs it: a subprocess. The other
examples run as ``__main__`` in this process (``support.inprocess.run_example``), which spares
each the seconds of importing TVM; what they print is the test.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.example_output import assert_shown_output_is_current
from support.inprocess import run_example

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
    assert_shown_output_is_current("qdq_cnn.py", result.stdout)
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
    return run_example(ROOT / "examples" / name)


#: Dequantizes of integer constants that no conv / matmul / dense reads, per model (issue 39:
#: keep-qdq-weights keeps a weight's dequantize only): two layer norms' scale and shift, and the
#: attention's scalar.
NOT_WEIGHT_OPERANDS = {"transformer_block": 5}


def test_frontend_annotation_example_keeps_every_weight_pattern_through_stock_folding() -> None:
    out = _run_example("frontend_annotation.py")
    assert_shown_output_is_current("frontend_annotation.py", out)
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
        # annotated first: weights became int8 constants, every dequantize of a conv / matmul
        # weight or bias stays (the transformer's layer norms' scale and shift and one scalar
        # multiply read an integer constant's dequantize too, but no weight op does: folded)
        kept = weights + biases - NOT_WEIGHT_OPERANDS.get(model, 0)
        assert rows[model, "annotated, stock FoldConstant"][:2] == (0, kept)
        assert all(status == "ok" for (m, _), (*_, status) in rows.items() if m == model)
    placed_counts = [int(n) for n in re.findall(r"annotate placed (\d+) fold_barrier", out)]
    assert placed_counts == [
        rows[m, "annotated, stock FoldConstant"][1]
        for m in ("qdq_cnn", "residual_cnn", "transformer_block")
    ]
    assert out.rstrip().endswith("ok")


def test_backend_partition_example_offloads_every_quantized_op_only_after_fold_guard() -> None:
    out = _run_example("backend_partition.py")
    assert_shown_output_is_current("backend_partition.py", out)
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


def test_pytorch_example_keeps_int8_weights_and_matches_pytorch() -> None:
    out = _run_example("frontend_pytorch.py")
    assert_shown_output_is_current("frontend_pytorch.py", out)
    modules = ("imported", "stock FoldConstant", "fold_guard keep-qdq-weights")
    # model, module, quantize(const), int8 weight DQ, max |out - torch|
    rows = {
        (m.group(1), m.group(2)): (int(m.group(3)), int(m.group(4)), float(m.group(5)))
        for m in re.finditer(
            r"^(\S+)\s+(" + "|".join(modules) + r")\s+(\d+)\s+(\d+)\s+(\S+)$", out, re.M
        )
    }
    weights = {"conv": 1, "linear": 2, "depthwise": 2, "residual": 3, "residual*": 3}
    assert {model for model, _ in rows} == set(weights), out
    for model, count in weights.items():
        imported, stock, ours = (rows[model, m] for m in modules)
        float_weights = model.endswith("*")  # convert_pt2e(fold_quantize=False)
        assert imported[:2] == ((count, 0) if float_weights else (0, count))
        assert stock[:2] == (0, 0) and ours[:2] == (0, count)
        # within one output quantization step of PyTorch (the models' steps are above 0.005)
        assert max(imported[2], stock[2], ours[2]) < 0.005, out
    assert out.count("keep-qdq-weights vs imported: bit-identical") == len(weights)


def test_tflite_example_imports_every_form_and_keeps_its_weights() -> None:
    out = _run_example("frontend_tflite.py")
    assert_shown_output_is_current("frontend_tflite.py", out)
    assert "int8-dequantize      TVM's from_tflite: fails: KeyError 'conv/weight_int8'" in out
    modules = ("stock FoldConstant", "fold_guard keep-qdq-weights")
    # model, module, weights, constant bytes, max |out - numpy|
    rows = {
        (m.group(1), m.group(2)): (m.group(3), int(m.group(4)), float(m.group(5)))
        for m in re.finditer(
            r"^(\S+)\s+(" + "|".join(modules) + r")\s+(-|\d+ int8 DQ|\d+ float16 cast)\s+"
            r"(\d+)\s+(\S+)$",
            out,
            re.M,
        )
    }
    expected = {
        "full-int8": "2 int8 DQ",
        "int8-dequantize": "3 int8 DQ",
        "float16-dequantize": "6 float16 cast",
    }
    for form, weights in expected.items():
        stock, ours = rows[form, modules[0]], rows[form, modules[1]]
        assert stock[0] == "-" and ours[0] == weights, out
        assert ours[1] < stock[1]  # int8 or float16 weights instead of float32 ones
        assert max(stock[2], ours[2]) < 1e-3
    float16 = rows["float16-dequantize", modules[1]][1], rows["float16-dequantize", modules[0]][1]
    assert float16[0] * 2 == float16[1]
    assert out.count("keep-qdq-weights vs unfolded: bit-identical") == 3


def test_requantize_chain_example_folds_each_chain_to_one_int8_constant() -> None:
    out = _run_example("requantize_chains.py")
    assert_shown_output_is_current("requantize_chains.py", out)
    assert out.count("folded [fold-requantize-chain]") == 2
    # module, quantize calls, dequantize calls, DQ(int8 const), max |out - onnxruntime|
    rows = {
        m.group(1).strip(): tuple(int(m.group(i)) for i in (2, 3, 4)) + (float(m.group(5)),)
        for m in re.finditer(
            r"^([a-zA-Z +-]+?)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\S+)  bit-identical to imported$",
            out,
            re.M,
        )
    }
    assert rows["imported"][:3] == (5, 8, 2)  # 2 chains of Q/DQ on the weights
    assert rows["stock FoldConstant"][:3] == (3, 3, 0)  # only activations' Q/DQ left
    assert rows["keep-qdq-weights"][:3] == (3, 6, 2)  # one int8 dequantize per weight, at s2
    assert rows["keep-requantize + keep-qdq-weights"][:3] == (5, 8, 2)
    assert all(row[3] <= 0.05 for row in rows.values())  # one output step
    assert "folded int8 weights equal NumPy's requantization: True" in out


def test_lowbit_llm_example_keeps_every_dequantize_kernel_and_its_pattern() -> None:
    out = run_example(
        ROOT / "examples" / "lowbit_llm.py",
        ["--hidden", "128", "--intermediate", "256", "--heads", "2", "--tokens", "2"],
    )
    # module, constant bytes, dequantize(uint32 const), pattern matches of 7, output
    rows = {
        m.group(1).strip(): (int(m.group(2).replace(",", "")), int(m.group(3)), int(m.group(4)))
        for m in re.finditer(
            r"^(imported|stock FoldConstant|fold_guard keep-qdq-weights)\s+([\d,]+)\s+(\d+)\s+"
            r"(\d+) of 7  bit-identical to imported$",
            out,
            re.M,
        )
    }
    assert len(rows) == 3, out  # all three ran, bit for bit
    imported, stock, ours = (
        rows[k] for k in ("imported", "stock FoldConstant", "fold_guard keep-qdq-weights")
    )
    assert imported[1:] == (7, 7) and ours[1:] == (7, 7) and stock[1:] == (0, 0)
    assert ours[0] <= imported[0] < stock[0] / 3  # packed int4 against float16 weights
    for name in ("q", "k", "v", "o", "gate", "up", "down"):
        assert re.search(rf"^{name}\s+matches\s+-\s+matches$", out, re.M), out
    # the CUTLASS-style flow: only the annotated lifting keeps decode and TVM's pattern matches
    lifted = re.findall(
        r"^  (stock|annotate\(keep-qdq-weights\))\s+main gets (\S+)\s+main's kernels: (\S+)\s+"
        r"cutlass: (\S+)\s+bit-identical$",
        out,
        re.M,
    )
    assert (
        lifted
        == [
            ("stock", "float16", "-", "-"),
            ("annotate(keep-qdq-weights)", "int8,float16", "decode", "cutlass.decode_matmul"),
        ]
        * 2
    ), out
