"""The documentation site (docs/): it builds without a warning, its code runs, a browser shows it.

    docs/ ──sphinx-build -W -b html──▶ html        ==> exit 0, no warning (slow: about 15 s)
    html ──headless Chromium──▶ index.html           ==> title, the search box, no console error
                                api/fold_guard.html  ==> FoldConstant's / FoldPolicy's entries, search box
                                search.html?q=...    ==> the search finds the API page
    docs/**/*.md ──each ```python block──▶ a program of its own ==> exit 0 (support.codeblocks;
                                blocks importing fold_guard.relay run in the Relay suite)
    docs/guide/command-line.md's demo lines ==> in `fold-guard demo`'s output today, in order
    README.md's section headings of 2026-12-06 ==> each has a page (and section) in the site

The browser is Debian's Chromium (scripts/test.sh installs it) driven by Playwright, as the
drawing tests do; the site is served on 127.0.0.1 by Python's http.server, as a reader serves it
(Sphinx's search fetches pages, which a browser refuses over file://).
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest
from support.chromium import CHROMIUM, CHROMIUM_ARGS
from support.codeblocks import code_blocks, run_blocks

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: The site's own pages (docs/README.md is about the site, not in it).
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts and p != DOCS / "README.md")


def _is_relay(block: str) -> bool:
    return "fold_guard.relay" in block


#: (page, block) of every Relax python block; the Relay ones: tests/relay/test_docs_relay.py.
BLOCKS: List[Tuple[str, str]] = [
    (page.relative_to(DOCS).as_posix(), block)
    for page in PAGES
    for block in code_blocks(page, "python")
    if not _is_relay(block)
]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, object]:
    out = tmp_path_factory.mktemp("site") / "html"
    start = time.perf_counter()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-E",
            "-b",
            "html",
            str(DOCS),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    return {
        "html": out,
        "result": result,
        "seconds": time.perf_counter() - start,
    }


@pytest.mark.slow
def test_the_site_builds_without_a_warning(site) -> None:
    result = site["result"]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    html: Path = site["html"]
    for page in PAGES:
        built = html / page.relative_to(DOCS).with_suffix(".html")
        assert built.is_file(), f"{page} was not built (missing from every toctree?)"
    print(f"sphinx-build -W: {site['seconds']:.1f} s")


@pytest.fixture(scope="module")
def served(site) -> Iterator[str]:
    """The built site over HTTP on the loopback interface: its base URL."""
    handler = functools.partial(QuietHandler, directory=str(site["html"]))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:
        pass


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert os.path.exists(CHROMIUM), (
        "chromium is missing: scripts/test.sh installs it (apt-get install chromium)"
    )
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _open(browser, url: str):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: List[str] = []
    page.on(
        "console",
        lambda message: problems.append(message.text) if message.type == "error" else None,
    )
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(url)
    page.wait_for_load_state("load")
    return page, problems


def _search_box_visible(page) -> bool:
    # furo's sidebar search: a form posting to search.html with a "q" field.
    box = page.locator("form[action$='search.html'] input[name='q']").first
    return box.count() == 1 and box.is_visible()


@pytest.mark.slow
def test_front_page_renders_with_search_box_and_no_console_error(
    site, served, browser, tmp_path
) -> None:
    assert site["result"].returncode == 0
    page, problems = _open(browser, f"{served}/index.html")
    assert "fold_guard" in page.title()
    assert _search_box_visible(page)
    assert page.locator("h1").first.inner_text().startswith("fold_guard")
    # The user guide's toctree reaches every guide page.
    links = page.locator("a.reference.internal").evaluate_all("els => els.map(e => e.href)")
    for guide in (DOCS / "guide").glob("*.md"):
        assert any(link.endswith(f"guide/{guide.stem}.html") for link in links), guide.stem
    page.screenshot(path=str(tmp_path / "front.png"))
    page.close()
    assert problems == []


@pytest.mark.slow
def test_api_page_renders_the_docstrings_with_search_box_and_no_console_error(
    site, served, browser
) -> None:
    assert site["result"].returncode == 0
    page, problems = _open(browser, f"{served}/api/relax.html")
    assert _search_box_visible(page)
    # autodoc's entries: an id per documented name, its docstring's text beside it.
    assert page.locator("[id='fold_guard.relax.FoldConstant']").count() == 1
    assert page.locator("[id='fold_guard.relax.annotate']").count() == 1
    assert (
        "barrier" in page.locator("[id='fold_guard.relax.fold_barrier']").locator("..").inner_text()
    )
    page.close()
    core, more = _open(browser, f"{served}/api/fold_guard.html")
    assert core.locator("[id='fold_guard.FoldPolicy']").count() == 1
    relay, still_more = _open(browser, f"{served}/api/relay.html")
    assert relay.locator("[id='fold_guard.relay.fold_function']").count() == 1
    core.close()
    relay.close()
    assert problems + more + still_more == []


@pytest.mark.slow
def test_the_search_finds_the_api(site, served, browser) -> None:
    assert site["result"].returncode == 0
    page, problems = _open(browser, f"{served}/search.html?q=absorb_weight_dequantize")
    results = page.locator("#search-results ul.search li")
    results.first.wait_for(timeout=30_000)
    hrefs = results.locator("a").evaluate_all("els => els.map(e => e.getAttribute('href'))")
    assert any("api/relax.html" in href for href in hrefs), hrefs
    page.close()
    assert problems == []


def test_every_page_has_python_blocks_to_run_or_says_why() -> None:
    # Guards the extraction: the guide's code is found (a broken pattern would run nothing).
    pages = {page for page, _ in BLOCKS}
    assert {"guide/annotations.md", "guide/policies.md", "guide/partitioning.md"} <= pages


@pytest.fixture(scope="module")
def block_runs(tmp_path_factory) -> Dict[int, Tuple[int, str]]:
    return run_blocks([block for _, block in BLOCKS], tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize(
    "index", range(len(BLOCKS)), ids=[f"{p}:{i}" for i, (p, _) in enumerate(BLOCKS)]
)
def test_python_block_runs_as_written(block_runs, index) -> None:
    status, printed = block_runs[index]
    page, block = BLOCKS[index]
    assert status == 0, f"{page}:\n{block}\n{printed}"


@pytest.mark.slow
def test_the_command_line_page_shows_todays_demo_output() -> None:
    page = DOCS / "guide" / "command-line.md"
    (shown,) = [block for block in code_blocks(page, "text") if "keep-qdq-weights" in block]
    script = Path(sys.executable).with_name("fold-guard")
    result = subprocess.run([str(script), "demo"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    printed = iter(line for line in result.stdout.splitlines() if not line.startswith("time: "))
    for line in shown.splitlines():
        assert any(line == out for out in printed), (
            f"{page.name} line not in `fold-guard demo`: {line}"
        )


#: Every section of README.md as it was before the site (2026-12-06, commit 6fcd863), and of
#: RFC.md's sections whose detail moved out, with the page (and heading) of the site that holds
#: its text now.
HOMES = {
    "README: Install": "guide/install.md#install",
    "README: Quick start": "guide/install.md#quick-start",
    "README: Testing": "guide/testing.md#testing",
    "README: Use": "guide/annotations.md#entry-points",
    "README: Policies": "guide/policies.md#policies",
    "README: Frontends": "guide/frontends.md#frontends",
    "README: Inside a build pipeline": "guide/pipelines.md#inside-a-build-pipeline",
    "README: Weights as parameters": "guide/parameters.md#weights-as-parameters",
    "README: Partitioning": "guide/partitioning.md#partitioning",
    "README: Command line": "guide/command-line.md#the-command-line",
    "README: Errors, reports, settings": "guide/errors.md#errors-reports-settings",
    "README: Performance": "guide/performance.md#performance",
    "README: Limitations": "guide/errors.md#limitations",
    "README: More": "index.md#fold-guard",
    "RFC: Entry points and the report (the ledger, Model Explorer)": "guide/ledger.md#the-precision-ledger",
    "RFC: Frontends, requantize chains and low-precision weights": "guide/frontends.md#requantize-chains",
    "RFC: Lowered calls": "guide/lowered-kernels.md#lowered-kernels-and-low-bit-weights",
    "RFC: Evaluation (the fast engine's mechanisms)": "guide/performance.md#how-it-is-fast",
    "RFC: Evaluation (which kernels move data, fills, one copy)": "guide/performance.md#which-kernels-move-data",
    "RFC: Policies from a backend's table (in full)": "guide/backend-tables.md#how-a-table-becomes-a-policy",
    "RFC: Appendix A (the Relay stock rules mirrored)": "guide/relay.md#what-the-adapter-mirrors-of-stock",
    "RFC: Agreeing with the stock pass (the Relax rules in full)": "guide/policies.md#what-default-mirrors-of-stock",
}


def _anchors(page: Path) -> List[str]:
    # myst_heading_anchors' slugs: lower case, punctuation dropped, spaces to dashes.
    return [
        re.sub(r"[^\w\- ]", "", title).strip().lower().replace(" ", "-").replace("_", "-")
        for title in re.findall(r"^#{1,3} (.+)$", page.read_text(), re.M)
    ]


@pytest.mark.parametrize("section", sorted(HOMES))
def test_every_former_readme_section_has_a_home_in_the_site(section) -> None:
    page, anchor = HOMES[section].split("#")
    assert DOCS.joinpath(page).is_file(), HOMES[section]
    assert anchor in _anchors(DOCS / page), (section, _anchors(DOCS / page))


def test_the_example_output_check_sees_a_changed_number_and_ignores_times() -> None:
    from support.example_output import shown_output, stale_lines

    shown = shown_output("backend_partition.py")
    printed = shown.splitlines()
    assert stale_lines(shown, printed) == []
    assert stale_lines(shown, [line for line in printed if line.strip()]) == []
    # A fold time is not a claim: another run's times pass.
    assert stale_lines(shown, [line.replace("  1530 ms", "    91 ms") for line in printed]) == []
    # An offload count is: the line is reported.
    changed = [
        line.replace("5 / 5", "4 / 5", 1) if "qdq-accelerator" in line else line for line in printed
    ]
    assert stale_lines(shown, changed) == [printed[3]]
