"""scripts/measure_tolerance.py on Relay: the import and the FQ2I module within their tolerances."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _common import onnx_models

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_relay_pipelines_stay_a_step_inside_their_tolerances() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "measure_tolerance.py"), "--json"]
        + ["--models", "qdq_cnn", "--seeds", "1", "--inputs", "5"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    worst = {(r["pipeline"], r["reference"]): r["steps"] for r in json.loads(result.stdout)}
    assert set(worst) == {
        (pipeline, reference)
        for pipeline in ("relay import", "relay fq2i")
        for reference in ("unfused", "fused")
    }
    assert worst["relay import", "unfused"] < onnx_models.TOLERANCE_STEPS, worst
    assert worst["relay fq2i", "unfused"] < onnx_models.INTEGER_TOLERANCE_STEPS, worst
    # The FQ2I module rounds in integers: it does differ from the float reference.
    assert worst["relay fq2i", "unfused"] > 0, worst
