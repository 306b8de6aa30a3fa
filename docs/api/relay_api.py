"""Write ``relay_api.json``: the public names of ``fold_guard.relay`` with their signatures and
docstrings, read in the Relay environment (the only one where the adapter imports).

    .venv310/bin/python docs/api/relay_api.py          # rewrites docs/api/relay_api.json
    .venv310/bin/python docs/api/relay_api.py --check  # exit 1 if the file is not current

The Relax environment that builds the site renders the file (``docs/_ext/relay_api.py``);
``tests/relay/test_docs_relay.py`` runs the check in the Relay suite.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List

OUT = Path(__file__).with_name("relay_api.json")


def _signature(obj: Any) -> str:
    # The adapter's annotations are strings (postponed evaluation): show them bare.
    return re.sub(r"'([^']*)'", r"\1", str(inspect.signature(obj)))


def describe() -> Dict[str, Any]:
    import tvm

    import fold_guard.relay as adapter

    entries: List[Dict[str, str]] = []
    for name in adapter.__all__:
        obj = getattr(adapter, name)
        entries.append(
            {
                "name": name,
                "kind": "class" if inspect.isclass(obj) else "function",
                "defined_in": obj.__module__,
                "signature": _signature(obj),
                "doc": inspect.getdoc(obj) or "",
            }
        )
    return {
        "module": "fold_guard.relay",
        "read_with": f"tvm {tvm.__version__}",
        "doc": inspect.getdoc(adapter) or "",
        "names": entries,
    }


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    text = json.dumps(describe(), indent=1, sort_keys=True) + "\n"
    if args.check:
        current = OUT.read_text() if OUT.exists() else ""
        if current != text:
            print(f"{OUT} is not current: run .venv310/bin/python docs/api/relay_api.py")
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
