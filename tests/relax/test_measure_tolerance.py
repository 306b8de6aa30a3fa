"""scripts/measure_tolerance.py runs here and still finds the margin TOLERANCE_STEPS documents."""

import json
from pathlib import Path

import pytest
from _common import onnx_models
from support.inprocess import run_example

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_relax_import_stays_within_one_step_of_the_reference() -> None:
    # As ``python scripts/measure_tolerance.py --json ...``, in this process (support.inprocess).
    stdout = run_example(
        ROOT / "scripts" / "measure_tolerance.py",
        ["--json", "--models", "qdq_cnn", "transformer_block", "--seeds", "0", "--inputs", "5"],
    )
    records = json.loads(stdout)
    assert {r["pipeline"] for r in records} == {"relax import"}
    worst = {(r["model"], r["reference"]): r["steps"] for r in records}
    assert set(worst) == {
        (model, reference)
        for model in ("qdq_cnn", "transformer_block")
        for reference in ("unfused", "fused")
    }
    # One step of margin below the tolerance, as its documentation says.
    for model in ("qdq_cnn", "transformer_block"):
        assert worst[model, "unfused"] < onnx_models.TOLERANCE_STEPS, worst
