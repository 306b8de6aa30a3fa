#!/usr/bin/env python
"""Weights as parameters, larger than memory: quantizing them weight by weight with LazyTransformParams.

The model is ``layers`` fp32 weight matrices of ``(hidden, hidden)`` passed to ``main`` as
parameters (``num_input=1``), each as ``quantize(W) -> dequantize -> matmul`` on the activation:
an ONNX QDQ import with fp32 weights, weights detached. Three ways to get the weights ready
before run time, each in a fresh process (``_harness.run_worker``):

* ``stock``: ``LiftTransformParams`` on the module as imported, and the transform run eagerly on
  every fp32 weight in memory: it hands ``main`` fp32 weights (the dequantize is lifted too).
* ``stock-lazy``: the same transform made lazy (``ToNonDataflow``, ``RemovePurityChecking``,
  ``LazyTransformParams``): weights are loaded one at a time, results written out one at a time.
* ``fold_guard-lazy``: ``fold_guard.relax.annotate(mod, policy="keep-qdq-weights")`` first, then
  the same lazy lifting: the transform computes int8 weights and ``main`` keeps every dequantize.

A lazy transform's ``get_item(i)`` makes weight ``i`` (a fixed-seed generator: the model's
weights never exist all at once) and its ``set_item(i, value)`` writes the result to a file in a
temporary directory. The worker builds first (not timed), resets its peak RSS counter
(``/proc/self/clear_refs``), runs the transform (timed), and reports the peak RSS above what it
held before the run: the working set of the transform. The weights' own bytes are printed beside
it; ``stock`` must hold them all, the lazy transforms only a few at a time.

Run: .venv/bin/python bench/bench_lazy_params.py                       # 16 x 1024^2: 64 MiB
     .venv/bin/python bench/bench_lazy_params.py --hidden 4096 --layers 32   # 2 GiB of fp32
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict

import numpy as np
from _harness import peak_rss_kib, rss_kib, run_worker

MIB = 1 << 20
VARIANTS = ("stock", "stock-lazy", "fold_guard-lazy")
SCALE = np.float32(1.0 / 127.0)


def make_weight(index: int, hidden: int) -> np.ndarray:
    """Weight ``index``, in [-1, 1): the same bytes whenever it is asked for."""
    weight = np.random.default_rng(index).random((hidden, hidden), dtype=np.float32)
    weight *= 2.0  # in place: one weight-sized buffer, no float64 temporary
    weight -= 1.0
    return weight


def build_model(layers: int, hidden: int):
    from tvm import relax

    x = relax.Var("x", relax.TensorType((1, hidden), "float32"))
    weights = [
        relax.Var(f"w{i}", relax.TensorType((hidden, hidden), "float32")) for i in range(layers)
    ]
    bb = relax.BlockBuilder()
    scale, zero = relax.const(SCALE), relax.const(0, "int8")
    with bb.function("main", [x, *weights], attrs={"num_input": 1}):
        with bb.dataflow():
            act = x
            for weight in weights:
                q = bb.emit(relax.op.quantize(weight, scale, zero, axis=1, out_dtype="int8"))
                dq = bb.emit(relax.op.dequantize(q, scale, zero, axis=1, out_dtype="float32"))
                act = bb.emit(relax.op.matmul(act, dq))
            out = bb.emit_output(act)
        bb.emit_func_output(out)
    return bb.get()


def _reset_peak() -> None:
    # Writing 5 resets VmHWM to the current RSS (Linux 4.0+, proc(5)).
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def worker(variant: str, layers: int, hidden: int) -> Dict[str, Any]:
    import tvm
    import tvm.relax.op.vm  # LazyTransformParams (0.27) calls relax.op.vm.kill_object unimported
    from tvm import relax

    mod = build_model(layers, hidden)
    started = time.perf_counter()
    if variant == "fold_guard-lazy":
        import fold_guard.relax as fgr

        mod = fgr.annotate(mod, policy="keep-qdq-weights").mod
    lifted = relax.transform.LiftTransformParams()(mod)
    lazy = variant != "stock"
    if lazy:
        lifted = tvm.ir.transform.Sequential(
            [
                relax.transform.ToNonDataflow(),
                relax.transform.RemovePurityChecking(),
                relax.transform.LazyTransformParams(),
            ]
        )(lifted)
    main_ops = [
        b.value.op.name
        for block in lifted["main"].body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
    ]
    out_dir = tempfile.mkdtemp(prefix="fold_guard_lazy_")
    written: Dict[int, str] = {}

    def get_item(index: int):
        return tvm.runtime.tensor(make_weight(int(index), hidden))

    def set_item(index: int, value) -> None:
        array = value.numpy()
        path = os.path.join(out_dir, f"{int(index)}.npy")
        np.save(path, array)
        written[int(index)] = str(array.dtype)

    tvm.register_global_func("get_item", get_item, override=True)
    tvm.register_global_func("set_item", set_item, override=True)
    vm = relax.VirtualMachine(tvm.compile(lifted, target="llvm"), tvm.cpu())
    prepare = time.perf_counter() - started

    if lazy:
        _reset_peak()
        before = rss_kib()
        started = time.perf_counter()
        vm["main_transform_params"]()
    else:
        params = [tvm.runtime.tensor(make_weight(i, hidden)) for i in range(layers)]
        _reset_peak()
        before = rss_kib()  # the fp32 weights are in memory already: the eager transform's input
        started = time.perf_counter()
        results = vm["main_transform_params"](params)
        for index, value in enumerate(results):
            set_item(index, value)
    seconds = time.perf_counter() - started
    peak = peak_rss_kib()
    for path in os.listdir(out_dir):
        os.remove(os.path.join(out_dir, path))
    os.rmdir(out_dir)
    return {
        "seconds": seconds,
        "prepare_seconds": prepare,
        "peak_kib": peak,
        "delta_kib": peak - before,
        "before_kib": before,
        "outputs": len(written),
        "output_dtypes": sorted(set(written.values())),
        "main_dequantize": main_ops.count("relax.dequantize"),
        "main_barriers": main_ops.count("relax.fold_barrier"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per variant; the fastest is kept"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args.variant, args.layers, args.hidden)))
        return

    weight_bytes = args.layers * args.hidden * args.hidden * 4
    one_weight = args.hidden * args.hidden * 4
    print(
        f"{args.layers} fp32 weights of ({args.hidden}, {args.hidden}): "
        f"{weight_bytes / MIB:.0f} MiB in all, {one_weight / MIB:.1f} MiB each"
    )
    best: Dict[str, Dict[str, Any]] = {}
    for _ in range(args.repeat):
        for variant in VARIANTS:
            result = run_worker(
                __file__, {"variant": variant, "layers": args.layers, "hidden": args.hidden}
            )
            if variant not in best or result["seconds"] < best[variant]["seconds"]:
                best[variant] = result
    header = (
        f"{'variant':16} {'transform s':>11} {'build s':>8} {'peak above start':>17} "
        f"{'in weights':>10} {'outputs':>8} {'main: dequantize / barriers':>28}"
    )
    print(header)
    for variant in VARIANTS:
        r = best[variant]
        extra = r["delta_kib"] * 1024
        print(
            f"{variant:16} {r['seconds']:11.2f} {r['prepare_seconds']:8.1f} "
            f"{extra / MIB:13.0f} MiB {extra / one_weight:10.1f} "
            f"{r['outputs']:4d} {','.join(r['output_dtypes']):>3} "
            f"{r['main_dequantize']:14d} / {r['main_barriers']}"
        )
    stock, ours = best["stock"], best["fold_guard-lazy"]
    stock_total_kib = stock["delta_kib"] + weight_bytes // 1024  # stock held the inputs already
    print(
        f"fold_guard-lazy / stock: time {ours['seconds'] / stock['seconds']:.2f}x, "
        f"peak memory for the weights {ours['delta_kib'] / stock_total_kib:.3f}x "
        f"({ours['delta_kib'] * 1024 / one_weight:.1f} weights' worth against "
        f"{stock_total_kib * 1024 / one_weight:.1f})"
    )
    if ours["main_barriers"] != args.layers or ours["output_dtypes"] != ["int8"]:
        sys.exit("fold_guard-lazy did not keep every weight int8 behind its dequantize")


if __name__ == "__main__":
    main()
