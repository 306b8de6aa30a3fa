"""Legalization records: a warm fold reads what each kernel request legalized to from the cache.

    fold #1: legalize every request -> record (PrimFunc digest, operands, result type) or why not
    fold #2: same requests          -> read the records, LegalizeOps is not run at all

Every fold here is checked structurally equal to the stock pass (constants compared bit for bit).
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

import pytest
import tvm
from tvm import relax, topi

import fold_guard.relax as fgr
from fold_guard import PlanInvariantError
from fold_guard.relax import _kernel_cache, _kernels
from fold_guard.relax._legalized import legalizer_identity

try:
    from tests.relax.test_kernel_cache import _fold_checked
    from tests.relax.test_kernel_cache import _module as kernel_cache_module
except ImportError:  # tests/ is not a package: pytest puts tests/relax on sys.path
    from test_kernel_cache import _fold_checked
    from test_kernel_cache import _module as kernel_cache_module


def _module(rows: int = 8, cols: int = 16, seed: int = 0) -> tvm.IRModule:
    """dequantize(quantize(W)) + take(exp(B), scalar): with a decision request for the take."""
    return kernel_cache_module(rows, cols, seed, scalar_take=True)


@pytest.fixture
def legalized(monkeypatch) -> List[List[str]]:
    """The op of every request each LegalizeOps run of fold_guard legalizes, run by run."""
    runs: List[List[str]] = []
    real = _kernels._legalize

    def counting(functions: Dict[str, relax.Function]):
        runs.append(sorted(f.body.blocks[0].bindings[0].value.op.name for f in functions.values()))
        return real(functions)

    monkeypatch.setattr(_kernels, "_legalize", counting)
    return runs


def _records(root: Path) -> List[Path]:
    return sorted(root.glob("v2/*/legalized/*.json"))


def test_a_warm_fold_legalizes_nothing(tmp_path, legalized):
    mod = _module()
    first = _fold_checked(mod, tmp_path)
    assert legalized and first.report.kernels_compiled > 0
    recorded = _records(tmp_path)
    assert len(recorded) >= 4  # quantize, dequantize, exp, take (and the take's decision)
    legalized.clear()
    second = _fold_checked(mod, tmp_path)
    assert legalized == []
    assert second.report.kernels_compiled == 0
    assert second.report.kernels_cached == first.report.kernels_compiled
    assert _records(tmp_path) == recorded


def test_other_weights_of_the_same_shapes_reuse_the_records(tmp_path, legalized):
    _fold_checked(_module(seed=0), tmp_path)
    legalized.clear()
    _fold_checked(_module(seed=1), tmp_path)
    assert legalized == []


def test_other_shapes_are_legalized(tmp_path, legalized):
    _fold_checked(_module(8, 16), tmp_path)
    legalized.clear()
    _fold_checked(_module(5, 7), tmp_path)
    assert legalized, "a request of other shapes has no record yet"


def test_no_cache_no_records(tmp_path, legalized):
    for _ in range(2):
        _fold_checked(_module(), False)
    assert len(legalized) == 2
    assert not list(tmp_path.iterdir())


def test_the_identity_names_the_python_legalizer():
    identity = legalizer_identity("relax.exp")
    assert identity is not None
    assert "legalize_ops" in identity and "topi.math.exp" in identity
    assert legalizer_identity("relax.exp") == identity  # read once per registration
    assert legalizer_identity("relax.sin") != identity  # one closure, another value in it
    assert legalizer_identity("relax.print") is None  # no FLegalize: nothing to key


def test_records_made_before_a_replacement_are_not_used(tmp_path, legalized):
    """A user's legalizer for exp, registered over TVM's: stock folds with it, and so must we."""
    mod = _module()
    _fold_checked(mod, tmp_path)
    op = tvm.ir.Op.get("relax.exp")
    original = op.get_attr("FLegalize")

    def negate_instead(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        return bb.call_te(topi.negative, call.args[0])

    tvm.ir.register_op_attr("relax.exp", "FLegalize", negate_instead, level=11)
    try:
        assert "negate_instead" in str(legalizer_identity("relax.exp"))
        legalized.clear()
        _fold_checked(mod, tmp_path)  # equal to stock, which negates: the old record would not
        assert legalized == [["relax.exp"]], "only the request whose legalizer changed"
    finally:
        op.reset_attr("FLegalize")
        tvm.ir.register_op_attr("relax.exp", "FLegalize", original)
    legalized.clear()
    _fold_checked(mod, tmp_path)
    assert legalized == [], "TVM's own legalizer is back, and so are its records"


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong shape", "wrong operands"])
def test_a_damaged_record_is_legalized_again_and_rewritten(tmp_path, legalized, damage):
    mod = _module()
    _fold_checked(mod, tmp_path)
    record = _records(tmp_path)[0]
    intact = record.read_text()
    if damage == "garbage":
        record.write_bytes(b"\x00\xff not json")
    elif damage == "truncated":
        record.write_text(intact[: len(intact) // 2])
    elif damage == "wrong shape":
        record.write_text(json.dumps(["kernel", "digest"]))
    else:
        record = next(r for r in _records(tmp_path) if json.loads(r.read_text())[0] == "kernel")
        intact = record.read_text()
        stored = json.loads(intact)
        stored[2] = [7]  # an operand index no request here has
        record.write_text(json.dumps(stored))
    legalized.clear()
    _fold_checked(mod, tmp_path)
    assert len(legalized) == 1 and len(legalized[0]) == 1, "the damaged record's request only"
    assert json.loads(record.read_text()) == json.loads(intact)


def test_a_kernel_gone_from_the_cache_is_legalized_when_needed(tmp_path, legalized):
    """The record stands in for the PrimFunc; the library that held its code was evicted."""
    mod = _module()
    first = _fold_checked(mod, tmp_path)
    for library in tmp_path.glob("v2/*/libs/*.so"):
        library.unlink()
    legalized.clear()
    again = _fold_checked(mod, tmp_path)
    assert again.report.kernels_compiled == first.report.kernels_compiled
    assert len(legalized) == first.report.kernels_compiled, "one on-demand LegalizeOps each"
    assert all(len(run) == 1 for run in legalized)


def test_a_record_that_no_longer_matches_is_a_clear_error(tmp_path):
    mod = _module()
    _fold_checked(mod, tmp_path)
    for record in _records(tmp_path):
        stored = json.loads(record.read_text())
        if stored[0] == "kernel":
            stored[1] = "0" * 64  # a digest no PrimFunc has
            record.write_text(json.dumps(stored))
    for library in tmp_path.glob("v2/*/libs/*.so"):
        library.unlink()  # so the kernels are legalized again, and compared with their records
    with pytest.raises(PlanInvariantError, match="delete the kernel cache directory"):
        fgr.fold(mod, kernel_cache=tmp_path)
    tvm.ir.assert_structural_equal(mod, _module())  # the caller's module is untouched


def test_records_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(_kernel_cache, "MAX_LEGALIZED_ENTRIES", 2)
    monkeypatch.setattr(_kernel_cache, "_TRIM_KEY_PREFIX", "")  # count on every write
    _fold_checked(_module(8, 16), tmp_path)
    _fold_checked(_module(5, 7), tmp_path)
    assert len(_records(tmp_path)) == 2
    monkeypatch.setattr(_kernel_cache, "_TRIM_KEY_PREFIX", "no key starts like this")
    _fold_checked(_module(3, 9), tmp_path)
    assert len(_records(tmp_path)) > 2, "between trims the records are not counted"


def test_a_running_profiler_is_left_alone(tmp_path, legalized):
    """cProfile's hook is not a Python callable: the probe would not be able to put it back."""
    import cProfile

    mod = _module()
    _fold_checked(mod, tmp_path)
    _legalized_identities().clear()
    profiler = cProfile.Profile()
    legalized.clear()
    profiler.enable()
    try:
        _fold_checked(mod, tmp_path)
    finally:
        profiler.disable()
    assert legalized, "no identity under a profiler, so no records: legalized as without a cache"
    assert sys.getprofile() is None
    legalized.clear()
    _fold_checked(mod, tmp_path)
    assert legalized == [], "the profiler has stopped: the records serve again"


def test_probing_a_legalizer_keeps_nothing_of_the_fold_alive(tmp_path):
    """The probe's frame would hold its callers' frames, and with them the whole fold (values
    included), in a cycle only the garbage collector frees: nothing may outlive the fold."""
    from fold_guard.relax._lower import CallSite

    mod = _module()
    _fold_checked(mod, tmp_path)
    _legalized_identities().clear()
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        result = fgr.fold(mod, kernel_cache=tmp_path)
        left = [o for o in gc.get_objects() if isinstance(o, CallSite)]
    finally:
        if was_enabled:
            gc.enable()
    assert result.report.kernels_cached, "the records and kernels served"
    assert left == [], f"{len(left)} call sites of the fold are still alive after it"


def _legalized_identities():
    from fold_guard.relax import _legalized

    return _legalized._IDENTITIES


@pytest.mark.slow
def test_a_fresh_process_reads_the_records(tmp_path):
    """The keys are the same in every process: legalizer identities do not drift as code runs."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from fold_guard.relax import _kernels
        from test_legalization_records import _fold_checked, _module
        runs = []
        real = _kernels._legalize
        _kernels._legalize = lambda functions: runs.append(len(functions)) or real(functions)
        _fold_checked(_module(), sys.argv[1])
        print(len(runs))
        """
    )
    counts = [
        subprocess.run(
            [sys.executable, "-c", script, str(tmp_path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        for _ in range(2)
    ]
    assert counts[0] != ["0"] and counts[1] == ["0"], counts
