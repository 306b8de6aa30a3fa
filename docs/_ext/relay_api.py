"""``.. relay-api::``: the Relay adapter's reference from ``docs/api/relay_api.json``.

The file holds what ``docs/api/relay_api.py`` read from ``fold_guard.relay`` in the Relay
environment (signatures, docstrings). Each docstring goes through napoleon's numpydoc
conversion, as autodoc's do, and becomes a ``py:function`` / ``py:class`` entry of the module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.ext.napoleon.docstring import NumpyDocstring
from sphinx.util.docutils import SphinxDirective

SOURCE = Path(__file__).resolve().parents[1] / "api" / "relay_api.json"


class RelayApi(SphinxDirective):
    has_content = False

    def run(self) -> List[nodes.Node]:
        self.env.note_dependency(str(SOURCE))
        data: Dict[str, Any] = json.loads(SOURCE.read_text())
        module = data["module"]
        lines = [f".. py:module:: {module}", ""]
        lines += NumpyDocstring(data["doc"], self.config, what="module", name=module).lines()
        lines.append("")
        for entry in data["names"]:
            kind = "class" if entry["kind"] == "class" else "function"
            lines.append(f".. py:{kind}:: {entry['name']}{entry['signature']}")
            lines.append(f"   :module: {module}")
            lines.append("")
            converted = NumpyDocstring(entry["doc"], self.config, what=kind, name=entry["name"])
            lines += [f"   {line}" if line else "" for line in converted.lines()]
            lines.append("")
        container = nodes.section()
        self.state.nested_parse(StringList(lines, source=str(SOURCE)), 0, container)
        return list(container.children)


def setup(app: Any) -> Dict[str, Any]:
    app.add_directive("relay-api", RelayApi)
    return {"parallel_read_safe": True, "version": "1"}
