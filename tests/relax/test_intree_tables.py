"""TVM's own Relax pattern tables on the QDQ CNN: the small case of ``examples/intree_tables.py``.

RFC.md, guarantee 3 up to a backend's partitioner. Per table (example_npu, nnapi, cuBLAS, CLML as
far as each goes without its device), three flows: stock ``FoldConstant``; ``fold`` with the
backend's policy; ``annotate``, a pipeline's stock ``FoldConstant``, then ``partition``. The
counts are derived from the module (how many quantized layers a table covers), never written in.
"""

from __future__ import annotations

from typing import Dict

import intree_tables  # examples/ is on the test path (pyproject: pythonpath)
import numpy as np
import pytest
import tvm
from _common import onnx_models, relax_byoc

import fold_guard.relax as fgr

# Imports and partitions a whole model per table (seconds each): full lane only.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def imported() -> tvm.IRModule:
    return intree_tables.load_model("qdq_cnn")


@pytest.fixture(scope="module")
def rows(imported: tvm.IRModule) -> Dict[str, Dict[str, object]]:
    flows = intree_tables.Flows(imported)
    return {
        name: intree_tables.run_flows(flows, table) for name, table in intree_tables.TABLES.items()
    }


def test_every_table_leaves_the_rest_of_the_module_as_it_was(rows) -> None:
    """The annotate flow's partition only regroups calls: nothing folded, nothing added."""
    assert all(row["rest unchanged"] for row in rows.values()), rows


def test_a_float_backend_under_default_gets_what_stock_gives(rows) -> None:
    """example_npu, nnapi, cuBLAS, CLML as shipped, under `default`: all three flows agree."""
    for name in ("example_npu", "nnapi", "cublas", "clml"):
        row = rows[name]
        assert row["stock"] == row["fold"] == row["annotate"], (name, row)
        assert row["stock"].int8 == 0


def test_absorbed_tables_bind_int8_weights_after_partition(imported, rows) -> None:
    """example_npu+absorb, CLML+absorb: every layer the table covers gets its int8 weight bound;
    stock folds the weights to fp32 first; CLML's own FoldConstant does the same after `fold`,
    which `partition` skips."""
    covered = relax_byoc.count_quantized_ops(imported, through_quantize=True)
    npu = rows["example_npu+absorb"]
    assert npu["could take"] == covered
    assert npu["annotate"] == npu["fold"] and npu["annotate"].int8 == covered
    assert npu["stock"].int8 == 0
    clml = rows["clml+absorb"]
    assert clml["annotate"].int8 == clml["could take"] > 0 and clml["skipped"] == ("FoldConstant",)
    assert clml["fold"].int8 == 0 and clml["stock"].int8 == 0


def test_nnapi_absorbed_binds_what_fold_binds(rows) -> None:
    row = rows["nnapi+absorb"]
    assert row["annotate"] == row["fold"] and row["annotate"].int8 > 0 and row["stock"].int8 == 0


def test_the_partitioned_module_runs_bit_identical_to_the_annotated_one(imported) -> None:
    """example_npu+absorb after annotate, a stock fold and partition, its regions run by TVM."""
    table = intree_tables.TABLES["example_npu+absorb"]
    piped = tvm.relax.transform.FoldConstant()(fgr.annotate(imported, policy=table.policy).mod)
    partitioned = fgr.partition(piped, table.partition).mod
    model = onnx_models.make_qdq_cnn(0, float_weights=True)
    feed = list(onnx_models.input_feed(model).values())
    (ours,) = onnx_models.run_relax(relax_byoc.strip_codegen(partitioned), feed)
    (theirs,) = onnx_models.run_relax(piped, feed)
    np.testing.assert_array_equal(ours, theirs)
