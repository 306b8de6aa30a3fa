"""Model Explorer's side of the node-data tests: its own dataclasses, and its adapters' node ids.

:func:`rebuild` reads a node-data file into ``model_explorer.node_data_builder``'s dataclasses
(``dacite``, strict: an unknown or misspelt field, a missing one or a value of the wrong type
fails) and writes it back with their ``to_json_string()``. It needs only the pure-Python
``ai-edge-model-explorer`` package, not its 504 MB adapter: the default lane installs it
``--no-deps`` (scripts/test.sh).

Run as a script in a venv with Model Explorer and ``model-explorer-onnx`` (the ``model_explorer``
lane, tests/relax/test_model_explorer.py)::

    python model_explorer_ids.py MODEL.onnx|MODEL.tflite NODE_DATA.json

it prints JSON: ``{"graphs": {graph id: [{"id", "label", "tensors"}]}, "roundtrip": ...}``,
the nodes as the real adapter converts the model (``model_explorer_onnx``'s ``ONNXAdapter``;
the built-in TFLite flatbuffer adapter, C++) and our file rebuilt. It imports nothing of
fold_guard, so the ids are the adapters', not a copy of fold_guard's scheme.

``python model_explorer_ids.py --colours SHOT.png '#ef6c00' ...`` prints how many pixels of the
PNG have exactly each colour (Pillow, which that venv has and the test suites' do not).
"""

import copy
import json
import sys
from dataclasses import asdict
from typing import Any, Dict, List


def rebuild(data: Dict[str, Any], ndb: Any) -> Dict[str, Any]:
    """``data`` through ``node_data_builder``'s dataclasses and back (``to_json_string``).

    The dataclass types ``NodeDataResult.value`` as a number; Model Explorer's UI also takes a
    string (a category label: ``types.ts``, shown by the ``model_explorer`` lane's screenshot),
    so a string value is checked as such and the rest of its result against the dataclass.
    """
    import dacite

    config = dacite.Config(strict=True)

    def graph(fields: Dict[str, Any]) -> Any:
        checked = copy.deepcopy(fields)
        labels = {}
        for key, result in checked.get("results", {}).items():
            if isinstance(result.get("value"), str):
                labels[key] = result["value"]
                result["value"] = 0
        built = dacite.from_dict(ndb.GraphNodeData, checked, config=config)
        for key, label in labels.items():
            built.results[key].value = label
        return built

    if "results" in data:  # one graph's data alone
        return json.loads(graph(data).to_json_string())
    model = ndb.ModelNodeData(graphsData={gid: graph(fields) for gid, fields in data.items()})
    return json.loads(model.to_json_string())


def adapter_graphs(model_path: str) -> Dict[str, Any]:
    """``{graph id: [{"id", "label", "tensors"}]}`` as Model Explorer's adapter converts the file."""
    if model_path.endswith(".tflite"):
        from model_explorer.builtin_tflite_flatbuffer_adapter import (
            BuiltinTfliteFlatbufferAdapter,
        )

        collections = BuiltinTfliteFlatbufferAdapter().convert(model_path, settings={})
        # the built-in (C++) adapters' graphs are the JSON it wrote, as dicts
        graphs = [g for c in collections["graphCollections"] for g in c.graphs]
    else:
        from model_explorer_onnx.main import ONNXAdapter

        graphs = [asdict(g) for g in ONNXAdapter().convert(model_path, settings={})["graphs"]]

    def tensors(node: Dict[str, Any]) -> List[str]:
        return [
            attr["value"]
            for meta in node.get("outputsMetadata", [])
            for attr in meta["attrs"]
            if attr["key"] == "tensor_name"
        ]

    return {
        graph["id"]: [
            {"id": node["id"], "label": node["label"], "tensors": tensors(node)}
            for node in graph["nodes"]
        ]
        for graph in graphs
    }


def main(model_path: str, node_data_path: str) -> None:
    # Imported here: the suites collect this file for doctests, and their venvs have no adapter
    # (the 504 MB adapter lives only in the venv this script is run in).
    from model_explorer import node_data_builder as ndb

    with open(node_data_path) as f:
        data = json.load(f)
    print(json.dumps({"graphs": adapter_graphs(model_path), "roundtrip": rebuild(data, ndb)}))


def count_colours(png: str, colours: List[str]) -> Dict[str, int]:
    """How many pixels of ``png`` are exactly each ``#rrggbb`` colour."""
    from PIL import Image

    with Image.open(png) as image:
        counts = dict((rgb, n) for n, rgb in image.convert("RGB").getcolors(maxcolors=1 << 24))
    return {c: counts.get(tuple(int(c[i : i + 2], 16) for i in (1, 3, 5)), 0) for c in colours}


if __name__ == "__main__":
    if sys.argv[1] == "--colours":
        print(json.dumps(count_colours(sys.argv[2], sys.argv[3:])))
    else:
        main(sys.argv[1], sys.argv[2])
