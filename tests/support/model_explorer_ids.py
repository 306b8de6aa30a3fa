"""Run in a Model Explorer venv: the real adapter's node ids, and our node data through its dataclasses.

``python model_explorer_ids.py MODEL.onnx NODE_DATA.json`` prints JSON:
``{"graphs": {graph id: [node ids]}, "roundtrip": <our file, rebuilt with model_explorer's
node-data dataclasses and written by their to_json_string()>}``. It imports the installed
``model_explorer_onnx`` (0.4.x) and ``model_explorer`` (ai-edge-model-explorer), nothing of
fold_guard, so the ids are the adapter's, not a copy of its scheme.
"""

import json
import sys


def main(model_path: str, node_data_path: str) -> None:
    # Imported here: the suites collect this file for doctests, and their venvs have no Model
    # Explorer (the 504 MB adapter lives only in the venv this script is run in).
    from model_explorer import node_data_builder as ndb
    from model_explorer_onnx.main import ONNXAdapter

    graphs = ONNXAdapter().convert(model_path, settings={})["graphs"]
    ids = {graph.id: [node.id for node in graph.nodes] for graph in graphs}
    with open(node_data_path) as f:
        data = json.load(f)
    rebuilt = ndb.ModelNodeData(
        graphsData={
            graph_id: ndb.GraphNodeData(
                results={
                    key: ndb.NodeDataResult(**value) for key, value in graph["results"].items()
                },
                name=graph.get("name"),
                thresholds=[ndb.ThresholdItem(**item) for item in graph.get("thresholds", [])],
                gradient=[ndb.GradientItem(**item) for item in graph.get("gradient", [])],
                showLabelCountColumnsInChildrenStatsTable=graph.get(
                    "showLabelCountColumnsInChildrenStatsTable", False
                ),
            )
            for graph_id, graph in data.items()
        }
    )
    print(json.dumps({"graphs": ids, "roundtrip": json.loads(rebuilt.to_json_string())}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
