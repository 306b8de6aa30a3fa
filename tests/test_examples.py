"""The built-in example runs as the README says, and prints what it claims."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_qdq_example_keeps_weight_patterns_and_matches_onnxruntime() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "qdq_cnn.py")], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    assert result.returncode == 0, result.stderr
    rows = {
        match.group(1).strip(): (int(match.group(2)), int(match.group(3)), match.group(4))
        for match in re.finditer(r"^(imported|stock FoldConstant|fold_guard keep-qdq-weights)\s+(\d+)\s+(\d+)\s+\S+ \((.*)\)$", result.stdout, re.M)
    }
    # imported: 5 quantize(fp32 weight const); 5 dequantize(int32 bias const)
    assert rows["imported"][:2] == (5, 5)
    # stock folds all of them, dequantize included
    assert rows["stock FoldConstant"][:2] == (0, 0)
    # ours: the 5 weights became int8 constants, so 5 weight + 5 bias dequantize(const) remain
    assert rows["fold_guard keep-qdq-weights"][:2] == (0, 10)
    assert all(status == "ok" for _, _, status in rows.values()), rows
    assert "kept by policy [keep-dequantize-of-integer-constant]" in result.stdout
