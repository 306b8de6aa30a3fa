#!/usr/bin/env bash
# The test suite in two environments, because the two adapters need TVM builds that cannot be
# installed side by side:
#
#   relax: Relax + core + repository checks. Python 3.11, .venv, pip install -e ".[test]"
#          (apache-tvm 0.27; mypy, codespell, ruff, onnxruntime for the type, spelling, lint and
#          example checks; torch, torchao and tflite for the frontend tests), and Model
#          Explorer's pure-Python package without its adapter (the node-data tests).
#   relay: Relay + core. Python 3.10, .venv310, tests/relay/requirements.txt (hhb-tvm 3.2.3 =
#          TVM 0.16 with Relay and QNN) and fold_guard itself (pyproject asks for apache-tvm only
#          on Python >= 3.11).
#
# Usage: bash scripts/test.sh [full|fast] [relax|relay] [pytest arguments...]
#        bash scripts/test.sh model-explorer [pytest arguments...]
#
# Three lanes:
#   full  (the default; what CI (.ci/run) and the README run): every test of both suites but
#         the model-explorer lane's and the whole ONNX node-test corpus (`conformance`: minutes;
#         the full lane runs its sample), with `pytest -m "not model_explorer and not conformance"`,
#         plus the lint step in the Relax environment: `ruff check` and
#         `ruff format --check` (configured in pyproject.toml). The environments are (re)made
#         first, idempotently.
#   fast  (for development; the same selection plain `pytest` makes in either environment):
#         pyproject's addopts leave out the tests marked `slow` (whole models, seconds each)
#         and `stock` (canaries of TVM's own behaviour, no fold_guard code under test). No lint
#         step; an environment that already exists is used as it is (delete it, or run the full
#         lane, to re-install).
#   model-explorer (not in CI): the tests marked `model_explorer` (tests/relax/test_model_explorer.py),
#         `draw -o nodes.json` against Google's Model Explorer itself: its real ONNX and TFLite
#         adapters' node ids, and a screenshot of its server's page in headless Chromium. They
#         install ai-edge-model-explorer (a 128 MB adapter wheel, 504 MB unpacked),
#         model-explorer-onnx and Pillow into a venv of their own, .venv-model-explorer
#         ($FOLD_GUARD_MODEL_EXPLORER_VENV), made once and reused. Measured on 2 cores with .venv
#         in place: 1 min 40 s from scratch (about 40 s of it making that venv), about 1 minute
#         once it exists (7 tests: 3 models x 2 policies against the adapters' ids, then the
#         ResNet-50 screenshot, 35 s). The Relax environment is used as it is if it exists.
#         CI leaves it out: the download and the browser would add minutes to a run that must
#         stay under 20.
#   The markers are declared in pyproject.toml (--strict-markers); `-m slow`, `-m stock` or any
#   other -m among the pytest arguments replaces the lane's selection.
#
#   No suite name: both, in either lane side by side (one pytest process each; the Relax suite's
#   output as it goes, the Relay suite's when it is done); both run to the end even if the
#   other's tests fail, a broken setup still stops at once. The exit status is non-zero if
#   either failed or the lint step did.
#   Pytest arguments (-x, -k NAME, ...) go to every suite run.
#   PYTHON311 / PYTHON310 choose the interpreters.
set -euo pipefail
cd "$(dirname "$0")/.."

LANE=full
if [ "$#" -gt 0 ] && { [ "$1" = full ] || [ "$1" = fast ] || [ "$1" = model-explorer ]; }; then
    LANE="$1"
    shift
fi

SUITES=(relax relay)
if [ "$#" -gt 0 ] && { [ "$1" = relax ] || [ "$1" = relay ]; }; then
    SUITES=("$1")
    shift
fi

# Find an interpreter of exactly this version. A pyenv shim named python3.10 exists even when
# pyenv's global version is 3.11 (it then fails), so each candidate is run, not just located.
find_python() {
    local want="$1" override="$2" candidate root
    root="$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"
    for candidate in "$override" "python$want" "$root"/versions/"$want".*/bin/"python$want"; do
        if [ -n "$candidate" ] && "$candidate" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$want'.split('.'))))" 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    echo "scripts/test.sh: no Python $want found (tried \$PYTHON${want/./}, python$want, $root/versions/$want.*)." >&2
    echo "Install one (e.g. pyenv install $want) or point PYTHON${want/./} at it." >&2
    return 1
}

header() {
    printf '\n==================== %s ====================\n' "$1"
}

# In the fast and model-explorer lanes an existing environment is used as it is.
reuse_env() {
    [ "$LANE" != full ] && [ -x "$1/bin/python" ]
}

setup_relax() {
    local python
    if ! reuse_env .venv; then
        python="$(find_python 3.11 "${PYTHON311:-}")"
        "$python" -m venv .venv
        .venv/bin/pip install -q -e ".[test]"
        # Model Explorer's node-data dataclasses, which tests/relax/test_cli_node_data.py reads
        # every node-data file with: the pure-Python package alone (--no-deps: its 128 MB adapter
        # is only imported by the built-in adapters) and what importing it needs.
        .venv/bin/pip install -q --no-deps ai-edge-model-explorer==0.1.34
        .venv/bin/pip install -q dacite flask packaging portpicker requests termcolor \
            typing-extensions watchdog
    fi
    # The drawing tests (tests/relax/test_cli_draw.py) open fold-guard's HTML in Debian's headless
    # Chromium through Playwright; `playwright install` would download a browser, which fails here.
    if [ ! -x /usr/bin/chromium ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    fi
    # The root conftest.py leaves out suites the installed TVM cannot run; make sure that is not
    # this one (a wrong TVM here would otherwise shrink the suite instead of failing it).
    .venv/bin/python -c '
import importlib.util, sys, tvm
if not tvm.__version__.startswith("0.27."):
    sys.exit(f".venv has tvm {tvm.__version__}, the Relax suite needs apache-tvm 0.27")
# The frontend tests skip without these (where they cannot be installed); here they must be.
missing = [name for name in ("torch", "torchao", "tflite") if importlib.util.find_spec(name) is None]
if missing:
    sys.exit(f".venv lacks {missing} (the test extra installs them): the frontend tests need them")
try:
    import model_explorer.node_data_builder
except ImportError as err:
    sys.exit(f".venv cannot import model_explorer.node_data_builder ({err}): the node-data tests need it; "
             "delete .venv to have it re-made (pip install --no-deps ai-edge-model-explorer==0.1.34)")
print(f"tvm {tvm.__version__}")'
}

setup_relay() {
    local python
    if ! reuse_env .venv310; then
        python="$(find_python 3.10 "${PYTHON310:-}")"
        "$python" -m venv .venv310
        .venv310/bin/pip install -q -r tests/relay/requirements.txt
        .venv310/bin/pip install -q -e .
    fi
    .venv310/bin/python -c '
import importlib.metadata, importlib.util, sys, tvm
if importlib.util.find_spec("tvm.relay") is None:
    sys.exit(f".venv310 has tvm {tvm.__version__} without tvm.relay; the Relay suite needs it")
# Two TVM distributions would overwrite each other'"'"'s files: pyproject must not pull apache-tvm here.
for other in ("apache-tvm", "apache-tvm-ffi"):
    try:
        sys.exit(f"{other} {importlib.metadata.version(other)} is installed in .venv310; check the python_version markers in pyproject.toml")
    except importlib.metadata.PackageNotFoundError:
        pass
print(f"tvm {tvm.__version__} (tvm.relay present)")'
}

RESULTS="$(mktemp -d)"
trap 'rm -rf "$RESULTS"' EXIT

# The full lane selects every test but the model_explorer lane's and the conformance corpus
# (run it with -m conformance); the fast lane keeps pyproject's default selection.
LANE_ARGS=()
[ "$LANE" = full ] && LANE_ARGS=(-m "not model_explorer and not conformance")

if [ "$LANE" = model-explorer ]; then
    header "setup: Relax (Python 3.11, .venv)"
    setup_relax
    header "model-explorer lane: tests/relax/test_model_explorer.py"
    exec .venv/bin/python -m pytest tests/relax/test_model_explorer.py -m model_explorer "$@"
fi

run_relax() {
    .venv/bin/python -m pytest tests fold_guard examples/_common --ignore=tests/relay --ignore=fold_guard/relay \
        --junitxml="$RESULTS/relax.xml" "${LANE_ARGS[@]}" "$@"
}

run_relay() {
    .venv310/bin/python -m pytest tests/core tests/relay tests/support fold_guard examples/_common --ignore=fold_guard/relax \
        --junitxml="$RESULTS/relay.xml" "${LANE_ARGS[@]}" "$@"
}

# The lint step (full lane, Relax environment): both checks run, each says what it found.
LINT=""
run_lint() {
    local code=0
    header "lint: ruff check, ruff format --check (pyproject.toml [tool.ruff])"
    .venv/bin/ruff check --output-format concise . || code=1
    .venv/bin/ruff format --check . || code=1
    if [ "$code" -eq 0 ]; then LINT="passed"; else LINT="failed (see the lint step above)"; fi
    return "$code"
}

# "passed failed skipped" of one run, from its JUnit report (failed counts errors too).
count_tests() {
    "$1" - "$2" <<'PY'
import sys
import xml.etree.ElementTree as ET

totals = [0, 0, 0]
for suite in ET.parse(sys.argv[1]).getroot().iter("testsuite"):
    tests, failed, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "skipped"))
    failed += int(suite.get("errors", 0))
    totals = [totals[0] + tests - failed - skipped, totals[1] + failed, totals[2] + skipped]
print(*totals)
PY
}

declare -A TITLE=(
    [relax]="Relax + core + repository checks (Python 3.11, .venv, apache-tvm 0.27)"
    [relay]="Relay + core (Python 3.10, .venv310, hhb-tvm 3.2.3 = TVM 0.16 with Relay)"
)
declare -A PYTHON=([relax]=.venv/bin/python [relay]=.venv310/bin/python)
declare -A RESULT=()
status=0
passed=0 failed=0 skipped=0
record() {  # suite, pytest exit status
    local suite="$1" code="$2" p f s
    [ "$code" -eq 0 ] || status=1
    if [ -f "$RESULTS/$suite.xml" ]; then
        read -r p f s < <(count_tests "${PYTHON[$suite]}" "$RESULTS/$suite.xml")
        passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
        RESULT[$suite]="$p passed, $f failed, $s skipped (pytest exit status $code)"
    else
        RESULT[$suite]="no report (pytest exit status $code)"
    fi
}

if [ "${#SUITES[@]}" -gt 1 ]; then
    # Both suites: set both up (and lint), then run them side by side, one pytest process each
    # (a machine with two cores or more): the Relay suite in the background, its output printed
    # when it is done; the Relax suite in the foreground, so progress shows as it goes.
    for suite in "${SUITES[@]}"; do
        header "setup: ${TITLE[$suite]}"
        "setup_$suite"
    done
    if [ "$LANE" = full ]; then
        run_lint || status=1
    fi
    run_relay "$@" >"$RESULTS/relay.log" 2>&1 &
    relay_pid=$!
    header "suite 1/2: ${TITLE[relax]}"
    if run_relax "$@"; then code=0; else code=$?; fi
    record relax "$code"
    if wait "$relay_pid"; then code=0; else code=$?; fi
    header "suite 2/2: ${TITLE[relay]} (ran beside suite 1)"
    cat "$RESULTS/relay.log"
    record relay "$code"
else
    suite="${SUITES[0]}"
    header "suite: ${TITLE[$suite]}"
    "setup_$suite"
    if [ "$LANE" = full ] && [ "$suite" = relax ]; then
        run_lint || status=1
    fi
    if "run_$suite" "$@"; then code=0; else code=$?; fi
    record "$suite" "$code"
fi

header "summary ($LANE lane)"
[ -z "$LINT" ] || echo "lint: $LINT"
for suite in "${SUITES[@]}"; do
    echo "$suite: ${RESULT[$suite]}"
done
# One closing line over both runs, in the plain "N passed, N failed" form.
echo "total: $passed passed, $failed failed, $skipped skipped"
exit "$status"
