"""The ``onnx`` wheel's nine model-zoo CNNs fold as stock folds them, without compiling a kernel.

    ConstantOfShape(value) --from_onnx--> broadcast_to(<one-element const>, shape) [-> permute_dims]
        --fold(default)--> the weights as constants == stock FoldConstant's, bytes included

Every weight of these models is one value broadcast to its shape, so every folded call is a fill
or a copy (``fold_guard/relax/_engine/fills.py``, ``host.py``): the fold compiles no kernel, where
stock compiles one per weight shape at LLVM -O3. The six whose folded weights are under 100 MiB
run in the full lane (``slow``); alexnet, zfnet512 and vgg19 (233-548 MiB folded, and stock's
fold of each several seconds and twice that in memory) under their own marker,
``model_zoo_large`` (``pytest -m model_zoo_large tests/relax/test_onnx_zoo.py``).
``bench/bench_model_zoo.py`` times them all against stock and against the memory-speed floor.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import tvm
import tvm_ffi
from _common.onnx_zoo import LARGE_ZOO_MODELS, SMALL_ZOO_MODELS, ZOO_MODELS, load_zoo_model
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import fold_guard.relax as fgr
from fold_guard import Reason

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_model_zoo


def _fold_like_stock(name: str) -> None:
    mod = from_onnx(load_zoo_model(name), keep_params_in_input=False)
    copy = tvm.ir.load_json(tvm.ir.save_json(mod))
    result = fgr.fold(mod, policy="default", kernel_cache=False)
    assert tvm_ffi.structural_equal(mod, copy), "the input module changed"
    assert result.report.kernels_compiled == 0 and result.report.fallbacks == ()
    folded = [d for d in result.plan.decisions if d.reason is Reason.FOLDED]
    assert folded and {d.node for d in folded} == {d.node for d in result.plan.folded}
    stock = relax.transform.FoldConstant()(mod)
    # structural equality compares every constant's bytes
    assert tvm_ffi.structural_equal(result.mod, stock)


@pytest.mark.slow
@pytest.mark.parametrize("name", SMALL_ZOO_MODELS)
def test_a_zoo_model_folds_like_stock_without_a_kernel(name: str) -> None:
    _fold_like_stock(name)


@pytest.mark.model_zoo_large
@pytest.mark.parametrize("name", LARGE_ZOO_MODELS)
def test_a_large_zoo_model_folds_like_stock_without_a_kernel(name: str) -> None:
    _fold_like_stock(name)


def test_the_zoo_is_the_wheels_list_of_real_models() -> None:
    from _common.onnx_zoo import zoo_model_paths

    assert sorted(zoo_model_paths()) == sorted(ZOO_MODELS)
    assert set(SMALL_ZOO_MODELS) | set(LARGE_ZOO_MODELS) == set(ZOO_MODELS)


def test_the_benchmarks_floor_is_measured_and_its_ratios_computed(tmp_path) -> None:
    """The floor column is a copy timed in a worker, and every ratio divides measured seconds."""
    sizes = tmp_path / "sizes.json"
    sizes.write_text("[1048576, 4096, 3]")
    floor = bench_model_zoo.run_worker(
        bench_model_zoo.__file__, {"impl": "floor", "sizes": str(sizes)}
    )
    assert floor["seconds"] > 0
    best = {
        "stock": {"seconds": 8.0, "folded_sizes": [3 << 20], "peak_kib": 500 << 10},
        "cold": {
            "seconds": 0.5,
            "equal": True,
            "constants_after": 4 << 20,
            "delta_kib": 4 << 10,
            "peak_kib": 420 << 10,
            "kernels_compiled": 0,
        },
        "warm": {"seconds": 0.25},
        "settled": {"delta_kib": 3 << 10},
        "floor": {"seconds": 0.25},
    }
    line, equal = bench_model_zoo._row("m", best)
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert equal and cells[0] == "m" and cells[1] == "3.0"
    assert cells[5:9] == ["16.0x", "32.0x", "0.250", "2.00"]
    assert cells[10:14] == ["4.0", "3.0", "4.4", "yes"]
