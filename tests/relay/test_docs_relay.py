"""The site's Relay parts, checked where Relay imports (the Relay environment).

    docs/api/relay_api.json  == what docs/api/relay_api.py reads from fold_guard.relay today
    docs/**/*.md ──each ```python block importing fold_guard.relay──▶ a program ==> exit 0

The Relax suite builds the site and runs its other blocks (tests/test_docs.py).
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from support.codeblocks import code_blocks, run_blocks

DOCS = Path(__file__).resolve().parents[2] / "docs"
GENERATOR = DOCS / "api" / "relay_api.py"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts and p != DOCS / "README.md")
BLOCKS: List[Tuple[str, str]] = [
    (page.relative_to(DOCS).as_posix(), block)
    for page in PAGES
    for block in code_blocks(page, "python")
    if "fold_guard.relay" in block
]
RELAY_PRELOAD = ("numpy", "onnx", "tvm", "tvm.relay")


def test_the_relay_api_page_is_what_the_adapter_says_today() -> None:
    describe = runpy.run_path(str(GENERATOR))["describe"]
    committed = json.loads((DOCS / "api" / "relay_api.json").read_text())
    # Refresh with: .venv310/bin/python docs/api/relay_api.py
    assert committed == json.loads(json.dumps(describe()))


def test_the_site_has_relay_blocks() -> None:
    assert any(page == "guide/relay.md" for page, _ in BLOCKS)


@pytest.fixture(scope="module")
def block_runs(tmp_path_factory) -> Dict[int, Tuple[int, str]]:
    return run_blocks([block for _, block in BLOCKS], tmp_path_factory, preload=RELAY_PRELOAD)


@pytest.mark.slow
@pytest.mark.parametrize(
    "index", range(len(BLOCKS)), ids=[f"{p}:{i}" for i, (p, _) in enumerate(BLOCKS)]
)
def test_relay_python_block_runs_as_written(block_runs, index) -> None:
    status, printed = block_runs[index]
    page, block = BLOCKS[index]
    assert status == 0, f"{page}:\n{block}\n{printed}"
