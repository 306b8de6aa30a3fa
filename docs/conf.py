"""Sphinx configuration of fold_guard's documentation site (``bash scripts/docs.sh`` builds it).

Where a new topic goes (see also docs/README.md): one topic, one page under ``docs/guide/``
(``docs/guide/<topic>.md``, MyST Markdown), listed in the user guide's toctree in
``docs/index.md``. Text about an existing topic goes on that topic's page (partitioning in
``guide/partitioning.md``, the command in ``guide/command-line.md``, figures and benchmark
commands in ``guide/performance.md``); design goes into ``RFC.md`` (the site includes it whole).
The API reference (``docs/api/``) is generated from the docstrings: a new public name appears
once it is in its module's ``__all__``.

Every Python block of a page runs in the tests (``tests/test_docs.py``; a page's block that
imports ``fold_guard.relay`` runs in the Relay suite, ``tests/relay/test_docs_relay.py``), so a
block must be a whole program a reader can paste. A block that is not meant to run is not a
``python`` block (use ``text``).

The Relay API page: ``fold_guard.relay`` imports only on a TVM with Relay (the Relay environment,
hhb-tvm), so the Relax environment that builds the site cannot import it. Its signatures and
docstrings are read in the Relay environment by ``docs/api/relay_api.py`` into
``docs/api/relay_api.json`` (committed; ``tests/relay/test_docs_relay.py`` fails when the file
is not what the installed adapter gives) and rendered here by the small ``relay_api`` extension
below, through the same numpydoc conversion autodoc uses. Nothing is mocked.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

from fold_guard import __version__  # noqa: E402

project = "fold_guard"
author = "the fold_guard authors"
copyright = "2026, the fold_guard authors"
release = __version__
version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "relay_api",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "README.md", "_ext"]

myst_enable_extensions = ["colon_fence", "deflist"]
# Headings get anchors, so the README and other pages can link to a section.
myst_heading_anchors = 3

# API reference: numpydoc-style docstrings (the project's style), members in source order.
napoleon_google_docstring = False
napoleon_numpy_docstring = True
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}

html_theme = "furo"
html_title = f"fold_guard {__version__}"
html_static_path = ["_static"]
# A page without an icon makes the browser ask for /favicon.ico, a 404 in its console.
html_favicon = "_static/favicon.svg"
# No network at build or view time: no external fonts or scripts (furo ships its own assets).
