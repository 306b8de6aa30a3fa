"""``fold-guard offload MODEL --backend NAME`` and ``draw --backend`` on a real model file.

qdq_cnn.onnx ──offload --backend clml──▶ counts per fold, each call's composite or reason
             ──offload ... --json──────▶ against offload.schema.json, equal to the library's
             ──draw --backend clml─────▶ calls coloured by offload (SVG, node data)
--patterns MODULE:ATTRIBUTE ───────────▶ only with --trust-model (it is code)
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import onnx
import pytest
from _common import onnx_models as om
from support.inprocess import run_cli

import fold_guard.relax as fgr
from fold_guard.cli._categories import CATEGORIES
from fold_guard.cli._offload import OFFLOAD_COLOURS, OFFLOAD_SCHEMA_PATH

# Each command imports a model and tries a table under nine folds (seconds): full lane only.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cnn(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("offload") / "qdq_cnn.onnx"
    onnx.save(om.make_qdq_cnn(0, float_weights=True), str(path))
    return path


def test_offload_prints_the_counts_and_every_call(cnn) -> None:
    done = run_cli("offload", str(cnn), "--backend", "clml", "-q")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"{cnn} (onnx, relax): table clml, 15 calls")
    counts = dict(line.split() for line in lines[2:12])
    assert counts["stock"] == counts["default"] == counts["backend:clml"] == "14"
    assert counts["qdq-accelerator"] == "10"
    # the missed call, named after its ONNX layer, with its reason
    assert "  check-refused (1):" in lines
    assert any(
        line.startswith("    fc (relax.add): the structure matches openclml.relax.add")
        for line in lines
    )


def test_offload_json_follows_its_schema_and_the_library(cnn) -> None:
    done = run_cli("offload", str(cnn), "--backend", "clml", "--json", "-q")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    with open(OFFLOAD_SCHEMA_PATH) as handle:
        jsonschema.validate(data, json.load(handle))
    mod = om.import_relax(onnx.load(str(cnn)))
    library = fgr.explain_offload(mod, "clml", policy=fgr.backend_policy("clml"))
    assert [(r["op"], r["composite"]) for r in data["report"]["rows"]] == [
        (row.op, row.composite) for row in library.rows
    ]
    assert data["counts"]["backend:clml"] == library.offloaded == data["report"]["offloaded"]


def test_a_users_table_is_imported_only_with_trust_model(cnn, tmp_path) -> None:
    (tmp_path / "my_npu_table.py").write_text(
        "from tvm.relax.dpl import is_op, wildcard\n"
        "TABLE = [('my_npu.conv2d', is_op('relax.nn.conv2d')(wildcard(), wildcard()))]\n"
    )
    refused = run_cli("offload", str(cnn), "--patterns", "my_npu_table:TABLE", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "--trust-model" in refused.stderr and len(refused.stderr.splitlines()) == 1
    done = run_cli(
        "offload", str(cnn), "--patterns", "my_npu_table:TABLE", "--trust-model", "-q", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "offloaded (4): my_npu.conv2d 4" in done.stdout


def test_an_unknown_table_is_one_line(cnn) -> None:
    done = run_cli("offload", str(cnn), "--backend", "no-such-npu", "-q")
    assert done.returncode == 2 and "no Relax pattern table 'no-such-npu'" in done.stderr


def test_draw_backend_colours_calls_by_offload(cnn, tmp_path) -> None:
    svg = tmp_path / "offload.svg"
    done = run_cli("draw", str(cnn), "--backend", "clml", "-o", str(svg), "-q")
    assert done.returncode == 0, done.stderr
    text = svg.read_text()
    assert OFFLOAD_COLOURS["offloaded"][0] in text  # the legend
    decision_colours = {fill for _, fill in CATEGORIES.values()}
    assert not decision_colours & {fill for _, fill in OFFLOAD_COLOURS.values()}
    assert text.count(f'fill="{OFFLOAD_COLOURS["offloaded"][1]}"') == 14 + 1  # 14 calls, 1 swatch
    assert text.count(f'fill="{OFFLOAD_COLOURS["check-refused"][1]}"') == 1 + 1
    nodes = tmp_path / "nodes.json"
    done = run_cli("draw", str(cnn), "--backend", "clml", "-o", str(nodes), "-q")
    assert done.returncode == 0, done.stderr
    data = json.loads(nodes.read_text())
    graph = data if "results" in data else next(iter(data.values()))  # keyed by the graph's name
    values = {v["value"] for v in graph["results"].values()}
    assert (
        "offloaded: openclml.bias.nn.conv2d" in values and "not offloaded: check-refused" in values
    )
