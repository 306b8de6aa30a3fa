#!/usr/bin/env bash
# The test suite: two suites in two environments, because the two adapters need TVM builds that
# cannot be installed side by side, and a smoke lane on every other supported Python.
#
#   relax: Relax, the TVM-free core and the repository checks. Python 3.11, .venv,
#          pip install -e ".[test]" (apache-tvm 0.27; mypy, codespell, ruff, onnxruntime for the
#          type, spelling, lint and example checks; torch, torchao and tflite for the frontend
#          tests), and Model Explorer's pure-Python package without its adapter (the node-data
#          tests read every file through its dataclasses). The TVM-free tests (tests/core, the
#          doctests outside the adapters) run here only: they do not depend on the TVM beside them.
#          The documentation site is built (Sphinx, -W), its Python blocks run and Chromium opens
#          it here too (tests/test_docs.py), as are the release files (tests/test_release.py) and
#          apache-tvm-tirx beside apache-tvm (tests/test_tvm_cores.py, a venv of its own).
#   relay: Relay (tests/relay, fold_guard/relay's doctests). Python 3.10, .venv310,
#          tests/relay/requirements.txt (hhb-tvm 3.2.3 = TVM 0.16 with Relay and QNN, and
#          fold_guard's plain dependencies), then fold_guard itself with `pip install --no-deps
#          -e .`: its apache-tvm dependency would overwrite hhb-tvm's files.
#   smoke: each other Python fold_guard supports (SMOKE_PYTHONS: 3.10, 3.12, 3.13, 3.14), in
#          .venv-py<version>: the README's install (pip install -e ".[examples]") with Relax on
#          apache-tvm 0.27, plus pytest and hypothesis; then SMOKE_TESTS: the README's example
#          (examples/qdq_cnn.py, run as a user runs it) and `fold-guard demo`, each checked by its
#          test, and a fast subset of the Relax suite (TVMScript parsing, the command's
#          contract, bad input, threads, the core). A Python this machine lacks is reported as
#          skipped, by name; one that is here and fails, fails the lane.
#
# Usage: bash scripts/test.sh [full|fast|stock|smoke] [relax|relay] [pytest arguments...]
#        bash scripts/test.sh model-explorer [pytest arguments...]
#
#   full  (the default; what CI (.ci/run) and the README run): the environments (re)made,
#         idempotently and side by side; the lint step (ruff check, ruff format --check, in
#         .venv); then the Relax and Relay suites side by side, one pytest process each, and a
#         smoke lane per Python, each as soon as a core is free (two lanes at a time). Every
#         test but the `stock` canaries (see stock), the model-explorer lane and the whole ONNX
#         node-test corpus (`pytest -m conformance`, minutes; the full lane runs its sample, marked
#         slow), and the three large model-zoo CNNs of the onnx wheel (`pytest -m model_zoo_large
#         tests/relax/test_onnx_zoo.py`: alexnet, zfnet512, vgg19, 233-548 MiB of weights once
#         folded, stock's fold of each several seconds and about 1.5 GiB; the full lane runs the
#         six smaller ones, marked slow); hypothesis's `ci` profile (conftest.py: a quarter of each property test's
#         examples, derandomized); the 30 slowest tests of each run listed. A clean clone's
#         `CI=true bash .ci/run` on the idle 2-core machine (2026-12-06): 1,035 s in all; setup
#         88 s (both environments side by side, pip's cache warm), then Relax 947 s (1,896
#         tests) beside Relay 774 s (1,157), then the smoke lanes, 46-62 s per Python (520 tests
#         each), 3.14 skipped.
#   fast  (for development; the same selection plain `pytest` makes in either environment):
#         pyproject's addopts leave out the tests marked `slow` (whole models, seconds each),
#         `stock`, `model_explorer`, `conformance` and `model_zoo_large`. No lint step, no smoke lane; an environment that already
#         exists is used as it is (delete it, or run the full lane, to re-install).
#   stock the canaries of TVM's own behaviour (`-m stock`: the stock passes and the corpora's
#         records of them, no fold_guard code under test; 137 + 351 tests, 59 s + 74 s). Both TVMs
#         are pinned exactly, so these can only change when a pin does: tests/stock_tvm.txt
#         records the TVM each suite's canaries last passed on, the full lane runs them too for
#         an environment whose TVM differs from it, and this lane, when it passes, writes the
#         installed TVMs there. Run it after moving a pin, or after changing a stock test or a
#         corpus record (commit the file it writes).
#   smoke the smoke lane alone (SMOKE_PYTHONS="3.12 3.13" bash scripts/test.sh smoke: some).
#   model-explorer (not in CI): the tests marked `model_explorer` (tests/relax/test_model_explorer.py),
#         `draw -o nodes.json` against Google's Model Explorer itself: its real ONNX and TFLite
#         adapters' node ids, and a screenshot of its server's page in headless Chromium. They
#         install ai-edge-model-explorer (a 128 MB adapter wheel, 504 MB unpacked),
#         model-explorer-onnx and Pillow into a venv of their own, .venv-model-explorer
#         ($FOLD_GUARD_MODEL_EXPLORER_VENV), made once and reused: 1 min 40 s from scratch,
#         about 1 minute once it exists. The Relax environment is used as it is if it exists.
#         CI leaves it out: the download and the browser would add minutes to every run.
#
#   `-m EXPR` among the pytest arguments replaces a lane's selection (`-m ''`: every test);
#   `--hypothesis-profile=full` gives each property test its full count of examples (hypothesis's
#   own default profile outside CI), e.g. `bash scripts/test.sh full --hypothesis-profile=full`.
#   The markers are declared in pyproject.toml (--strict-markers).
#
#   No suite name: both (and, in the full lane, the smoke lanes), each to the end even if another
#   fails; a broken setup stops at once. The exit status is non-zero if any lane failed or the
#   lint step did. The Relax suite's output shows as it goes, each other lane's when it is done.
#   Pytest arguments (-x, -k NAME, ...) go to every suite run (not to the smoke lane).
#   PYTHON311 / PYTHON310 / PYTHON312 ... choose the interpreters.
set -euo pipefail
cd "$(dirname "$0")/.."

LANE=full
if [ "$#" -gt 0 ] && [[ "$1" =~ ^(full|fast|stock|smoke|model-explorer)$ ]]; then
    LANE="$1"
    shift
fi

SUITES=(relax relay)
if [ "$#" -gt 0 ] && { [ "$1" = relax ] || [ "$1" = relay ]; }; then
    SUITES=("$1")
    shift
fi
[ "$LANE" = smoke ] && SUITES=()

#: Every supported Python but the full lane's 3.11 (pyproject.toml: requires-python, classifiers).
read -r -a SMOKE_PYTHONS <<<"${SMOKE_PYTHONS:-3.10 3.12 3.13 3.14}"
#: The smoke lane's tests: what a user's first minutes touch, and what a Python release changes
#: (ast and inspect under TVMScript, argparse, threads, the TVM-free core's dataclasses).
SMOKE_TESTS=(
    tests/test_examples.py::test_qdq_example_keeps_weight_patterns_and_matches_onnxruntime
    tests/test_readme.py::test_the_command_line_section_shows_todays_output
    tests/relax/test_annotations.py
    tests/relax/test_cli_contract.py
    tests/relax/test_bad_input_catalogue.py
    tests/relax/test_errors.py
    tests/relax/test_parallel_evaluation.py
    tests/core
)

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

# In the fast lane (and the stock and model-explorer lanes) an existing environment is used as it is.
reuse_env() {
    [ "$LANE" != full ] && [ "$LANE" != smoke ] && [ -x "$1/bin/python" ]
}

RESULTS="$(mktemp -d)"
trap 'rm -rf "$RESULTS"' EXIT

# Editable installs write fold_guard.egg-info into this tree: one at a time.
editable_install() {  # venv, pip arguments...
    local venv="$1"
    shift
    flock "$RESULTS/editable-install.lock" "$venv/bin/pip" install -q "$@"
}

setup_relax() {
    local python
    if ! reuse_env .venv; then
        python="$(find_python 3.11 "${PYTHON311:-}")"
        "$python" -m venv .venv
        editable_install .venv -e ".[test]"
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
        editable_install .venv310 --no-deps -e .
    fi
    .venv310/bin/python -c '
import importlib.metadata, importlib.util, re, sys, tvm
if importlib.util.find_spec("tvm.relay") is None:
    sys.exit(f".venv310 has tvm {tvm.__version__} without tvm.relay; the Relay suite needs it")
# Two TVM distributions would overwrite each other'"'"'s files: fold_guard goes in with --no-deps.
for other in ("apache-tvm", "apache-tvm-ffi"):
    try:
        sys.exit(f"{other} {importlib.metadata.version(other)} is installed in .venv310; install fold_guard there with pip install --no-deps")
    except importlib.metadata.PackageNotFoundError:
        pass
# ... so its other dependencies come from tests/relay/requirements.txt: none may be missing.
missing = []
for requirement in importlib.metadata.requires("fold-guard") or []:
    name = re.split(r"[ ;<>=!~\[]", requirement, maxsplit=1)[0]
    if "extra ==" in requirement or name.startswith("apache-tvm"):
        continue
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        missing.append(name)
if missing:
    sys.exit(f".venv310 lacks fold_guard dependencies {missing}: add them to tests/relay/requirements.txt")
print(f"tvm {tvm.__version__} (tvm.relay present)")'
}

declare -A TITLE=(
    [relax]="Relax + core + repository checks (Python 3.11, .venv, apache-tvm 0.27)"
    [relay]="Relay (Python 3.10, .venv310, hhb-tvm 3.2.3 = TVM 0.16 with Relay)"
)
for version in "${SMOKE_PYTHONS[@]}"; do
    TITLE[smoke-$version]="smoke: Python $version (the README's install, example and demo; a fast subset)"
done
declare -A VENV=([relax]=.venv [relay]=.venv310)
#: The TVM distribution each suite's environment is pinned to (tests/stock_tvm.txt's names).
declare -A TVM_DIST=([relax]=apache-tvm [relay]=hhb-tvm)

installed_tvm() {  # suite -> "apache-tvm==0.27.0.post1"
    "${VENV[$1]}/bin/python" -c 'import importlib.metadata, sys; print(f"{sys.argv[1]}=={importlib.metadata.version(sys.argv[1])}")' "${TVM_DIST[$1]}"
}

recorded_tvm() {  # suite -> what tests/stock_tvm.txt records for it (empty if nothing)
    awk -v suite="$1" '$1 == suite { print $2 }' tests/stock_tvm.txt 2>/dev/null || true
}

# Each lane's pytest selection. The full lane: every test but the stock canaries (unless this
# environment's TVM is not the one they last passed on), the model_explorer lane, the whole
# conformance corpus and the large model-zoo CNNs.
declare -A SELECTION=()
NOTES=()
choose_selection() {  # suite
    local suite="$1" installed recorded
    case "$LANE" in
        fast) SELECTION[$suite]="" ;;  # pyproject's addopts
        stock) SELECTION[$suite]="stock" ;;
        full)
            installed="$(installed_tvm "$suite")"
            recorded="$(recorded_tvm "$suite")"
            if [ "$installed" = "$recorded" ]; then
                SELECTION[$suite]="not stock and not model_explorer and not conformance and not model_zoo_large"
            else
                SELECTION[$suite]="not model_explorer and not conformance and not model_zoo_large"
                NOTES+=("$suite: $installed is not the ${recorded:-(nothing)} tests/stock_tvm.txt records: the stock canaries ran too; once they pass, record it with: bash scripts/test.sh stock $suite")
            fi
            ;;
    esac
}

pytest_args() {  # suite, junit report -> the lane's common pytest options, one per line
    printf '%s\n' "--junitxml=$2" --hypothesis-profile=ci
    [ -n "${SELECTION[$1]:-}" ] && printf '%s\n' -m "${SELECTION[$1]}"
    [ "$LANE" = fast ] || printf '%s\n' --durations=30
}

# Side by side, each suite keeps to one core: TVM's and OpenMP's thread pools would otherwise start
# a thread per core in both processes and spin-wait against each other. (fold_guard's own threads
# count the CPUs themselves and are unchanged.)
ONE_CORE=()
one_core() {
    ONE_CORE=(env TVM_NUM_THREADS=1 OMP_NUM_THREADS=1)
}

run_relax() {
    local args
    mapfile -t args < <(pytest_args relax "$RESULTS/relax.xml")
    "${ONE_CORE[@]}" .venv/bin/python -m pytest tests fold_guard examples/_common \
        --ignore=tests/relay --ignore=fold_guard/relay "${args[@]}" "$@"
}

# The TVM-free tests and doctests ran in the Relax suite: only what needs Relay runs here.
run_relay() {
    local args
    mapfile -t args < <(pytest_args relay "$RESULTS/relay.xml")
    "${ONE_CORE[@]}" .venv310/bin/python -m pytest tests/relay fold_guard/relay \
        examples/_common/relay_byoc.py "${args[@]}" "$@"
}

# One smoke lane per Python (lane "smoke-3.12"): a missing Python is a line of its own, not a
# failure. Its result goes to $RESULTS/smoke-<version>.status: "passed", "failed" or "skipped ...".
run_smoke() {  # version
    local version="$1" python venv
    if ! python="$(find_python "$version" "$(printenv "PYTHON${version/./}" || true)" 2>&1)"; then
        echo "skipped: $python"
        echo "skipped (no Python $version on this machine)" >"$RESULTS/smoke-$version.status"
        return 0
    fi
    venv=".venv-py$version"
    if "$python" -m venv "$venv" && editable_install "$venv" -e ".[examples]" pytest hypothesis &&
        "${ONE_CORE[@]}" "$venv/bin/python" -m pytest "${SMOKE_TESTS[@]}" fold_guard \
            --junitxml="$RESULTS/smoke-$version.xml" --hypothesis-profile=ci \
            -m "not stock and not model_explorer and not conformance and not model_zoo_large" --durations=10; then
        echo passed >"$RESULTS/smoke-$version.status"
    else
        echo failed >"$RESULTS/smoke-$version.status"
        return 1
    fi
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
    local python=python3
    [ -x .venv/bin/python ] && python=.venv/bin/python
    "$python" - "$1" <<'PY'
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

declare -A RESULT=() ELAPSED=()
status=0
passed=0 failed=0 skipped=0
COUNTS=""
add_counts() {  # junit report: COUNTS="N passed, N failed, N skipped", added to the totals
    local p f s
    read -r p f s < <(count_tests "$1")
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    COUNTS="$p passed, $f failed, $s skipped"
}
record() {  # lane, exit status
    local lane="$1" code="$2" outcome
    [ "$code" -eq 0 ] || status=1
    if [ -f "$RESULTS/$lane.xml" ]; then
        add_counts "$RESULTS/$lane.xml"
        RESULT[$lane]="$COUNTS (pytest exit status $code)"
    elif [ -f "$RESULTS/$lane.status" ]; then
        read -r outcome <"$RESULTS/$lane.status"
        RESULT[$lane]="$outcome"
    else
        RESULT[$lane]="no report (exit status $code; see its log)"
    fi
}

# Runs "run_<lane>" in the background into $RESULTS/<lane>.log; LANE_PID[<lane>] is its pid.
declare -A LANE_PID=() STARTED=()
start_lane() {  # lane, arguments...
    local lane="$1"
    shift
    STARTED[$lane]=$SECONDS
    if [[ "$lane" == smoke-* ]]; then
        run_smoke "${lane#smoke-}" >"$RESULTS/$lane.log" 2>&1 &
    else
        "run_$lane" "$@" >"$RESULTS/$lane.log" 2>&1 &
    fi
    LANE_PID[$lane]=$!
}
# A lane's output is shown when it is done, but not into the live lane's: until that is done,
# finished lanes wait in HELD.
HELD=()
show_lane() {
    header "${TITLE[$1]} (done after ${ELAPSED[$1]} s)"
    cat "$RESULTS/$1.log"
}
finish_lane() {  # lane, exit status, the live lane (shown as it went)?
    local lane="$1" code="$2" live="${3:-}" held
    ELAPSED[$lane]=$((SECONDS - STARTED[$lane]))
    if [ -n "$live" ]; then
        echo "(${TITLE[$lane]}: done after ${ELAPSED[$lane]} s)"
        for held in "${HELD[@]}"; do show_lane "$held"; done
        HELD=()
        LIVE=""
    elif [ -n "${LIVE:-}" ]; then
        HELD+=("$lane")
    else
        show_lane "$lane"
    fi
    record "$lane" "$code"
}

# Sets up the suites' environments side by side (each one's output when it is done); stops at
# the first that fails.
setup_all() {
    local suite code=0
    declare -A pid=()
    for suite in "$@"; do
        "setup_$suite" >"$RESULTS/setup-$suite.log" 2>&1 &
        pid[$suite]=$!
    done
    for suite in "$@"; do
        header "setup: ${TITLE[$suite]}"
        if wait "${pid[$suite]}"; then code=0; else code=$?; fi
        cat "$RESULTS/setup-$suite.log"
        [ "$code" -eq 0 ] || exit "$code"
    done
    echo "(environments ready after $SECONDS s)"
}

if [ "$LANE" = model-explorer ]; then
    header "setup: Relax (Python 3.11, .venv)"
    setup_relax
    header "model-explorer lane: tests/relax/test_model_explorer.py"
    exec .venv/bin/python -m pytest tests/relax/test_model_explorer.py -m model_explorer "$@"
fi

SMOKE_LANES=()
for version in "${SMOKE_PYTHONS[@]}"; do SMOKE_LANES+=("smoke-$version"); done
LANES=()
if [ "$LANE" = smoke ] || [ "${#SUITES[@]}" -gt 1 ] || [ "$LANE" = full ]; then
    if [ "${#SUITES[@]}" -gt 0 ]; then
        setup_all "${SUITES[@]}"
        for suite in "${SUITES[@]}"; do choose_selection "$suite"; done
    fi
    if [ "$LANE" = full ]; then run_lint || status=1; fi
    # The longest first: the suites, then the smoke lanes.
    LANES=("${SUITES[@]}")
    if [ "$LANE" = smoke ] || { [ "$LANE" = full ] && [ "${#SUITES[@]}" -gt 1 ]; }; then
        LANES+=("${SMOKE_LANES[@]}")
    fi
    if [ "${#LANES[@]}" -gt 1 ]; then one_core; fi
    # Two lanes at a time (one per core); the next starts as soon as one of them is done.
    RUNNING=("${LANES[@]:0:2}")
    PENDING=("${LANES[@]:2}")
    for lane in "${RUNNING[@]}"; do start_lane "$lane" "$@"; done
    LIVE="${LANES[0]}"
    header "${TITLE[$LIVE]}"
    tail -n +1 -f --pid="${LANE_PID[$LIVE]}" "$RESULTS/$LIVE.log" &
    TAIL_PID=$!
    while [ "${#RUNNING[@]}" -gt 0 ]; do
        pids=()
        for lane in "${RUNNING[@]}"; do pids+=("${LANE_PID[$lane]}"); done
        if wait -n -p done_pid "${pids[@]}"; then code=0; else code=$?; fi
        still=()
        for lane in "${RUNNING[@]}"; do
            if [ "${LANE_PID[$lane]}" != "$done_pid" ]; then
                still+=("$lane")
            elif [ "$lane" = "$LIVE" ]; then
                wait "$TAIL_PID" || true
                finish_lane "$lane" "$code" live
            else
                finish_lane "$lane" "$code"
            fi
        done
        RUNNING=("${still[@]}")
        if [ "${#PENDING[@]}" -gt 0 ]; then
            start_lane "${PENDING[0]}" "$@"
            RUNNING+=("${PENDING[0]}")
            PENDING=("${PENDING[@]:1}")
        fi
    done
else
    suite="${SUITES[0]}"
    LANES=("$suite")
    header "suite: ${TITLE[$suite]}"
    "setup_$suite"
    choose_selection "$suite"
    STARTED[$suite]=$SECONDS
    if "run_$suite" "$@"; then code=0; else code=$?; fi
    ELAPSED[$suite]=$((SECONDS - STARTED[$suite]))
    record "$suite" "$code"
fi

# The stock lane records the TVM its canaries passed on: when every suite run passed, and ran
# every canary (no pytest arguments).
if [ "$LANE" = stock ] && [ "$status" -eq 0 ] && [ "$#" -gt 0 ]; then
    echo "tests/stock_tvm.txt: not written (pytest arguments narrowed the run)"
elif [ "$LANE" = stock ] && [ "$status" -eq 0 ]; then
    for suite in "${SUITES[@]}"; do
        line="$suite $(installed_tvm "$suite")"
        if ! grep -qxF "$line" tests/stock_tvm.txt; then
            sed -i "s|^$suite .*|$line|" tests/stock_tvm.txt
        fi
        echo "tests/stock_tvm.txt: $line"
    done
fi

header "summary ($LANE lane, $SECONDS s in all)"
[ -z "$LINT" ] || echo "lint: $LINT"
for lane in "${LANES[@]}"; do
    echo "$lane (${ELAPSED[$lane]} s): ${RESULT[$lane]}"
done
for note in "${NOTES[@]}"; do echo "note: $note"; done
# One closing line over every run, in the plain "N passed, N failed" form.
echo "total: $passed passed, $failed failed, $skipped skipped"
exit "$status"
