#!/usr/bin/env python
"""A 7B-class layer's low-bit weights as constants: stock FoldConstant against keep-qdq-weights.

The model is ``examples/_common/lowbit_llm.py``'s Llama-style decoder block: per layer the seven
projections of a 7B model (q / k / v / o of 4096 x 4096, gate / up of 4096 x 11008, down of
11008 x 4096) with MLC-LLM's q4f16_1 weights (int4 packed 8 to a uint32, an fp16 scale per 32),
each ``call_tir(dequantize, (<uint32 const>, <f16 const>)) -> permute_dims -> matmul``, the
generated weights bound as constants. Two ways to fold it, each in a fresh process
(``_harness.run_worker``):

* ``stock``: ``relax.transform.FoldConstant()``: every dequantize and its transpose evaluated
  into a float16 constant;
* ``fold_guard``: ``fold_guard.relax.fold(mod, policy="keep-qdq-weights")``: the dequantize
  kernels stay with their packed constants.

The worker builds the module (not timed), resets its peak RSS counter (``/proc/self/clear_refs``),
folds (timed) and reports the constant bytes after the fold, the dequantize kernels left, the
peak RSS of the process and its rise above the RSS before the fold. Ratios are against stock in
the same run.

Run: .venv/bin/python bench/bench_lowbit.py                  # widths / 8: CI's size, seconds
     .venv/bin/python bench/bench_lowbit.py --divisor 1      # one 7B layer: 202M weights
     .venv/bin/python bench/bench_lowbit.py --divisor 1 --layers 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict

from _harness import keep_best, peak_rss_kib, rss_kib, run_worker

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

MIB = 1 << 20
VARIANTS = ("stock", "fold_guard")
#: A 7B Llama layer.
HIDDEN, INTERMEDIATE, HEADS = 4096, 11008, 32


def widths(divisor: int) -> Dict[str, int]:
    """The layer's widths divided by ``divisor`` (rounded to q4f16_1's group of 32)."""

    def scaled(width: int) -> int:
        return max(32, round(width / divisor / 32) * 32)

    hidden = scaled(HIDDEN)
    heads = max(1, HEADS // divisor)
    while hidden % heads:
        heads -= 1
    return {"hidden": hidden, "intermediate": scaled(INTERMEDIATE), "heads": heads}


def _reset_peak() -> None:
    # Writing 5 resets VmHWM to the current RSS (Linux 4.0+, proc(5)).
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def worker(variant: str, layers: int, divisor: int) -> Dict[str, Any]:
    from _common import lowbit_llm
    from tvm import relax

    import fold_guard.relax as fgr

    mod = lowbit_llm.build_decoder_block(**widths(divisor), tokens=1, layers=layers)
    before_bytes = lowbit_llm.constant_bytes(mod)
    _reset_peak()
    before = rss_kib()
    started = time.perf_counter()
    if variant == "stock":
        folded = relax.transform.FoldConstant()(mod)
    else:
        folded = fgr.fold(mod, policy="keep-qdq-weights").mod
    seconds = time.perf_counter() - started
    peak = peak_rss_kib()
    return {
        "seconds": seconds,
        "peak_kib": peak,
        "delta_kib": peak - before,
        "constant_bytes_before": before_bytes,
        "constant_bytes": lowbit_llm.constant_bytes(folded),
        "dequantize_kept": len(lowbit_llm.dequantize_calls(folded)),
        "projections": 7 * layers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument(
        "--divisor", type=int, default=8, help="divide the 7B widths by this (1: full size)"
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per variant; the fastest is kept"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args.variant, args.layers, args.divisor)))
        return

    w = widths(args.divisor)
    print(
        f"{args.layers} decoder layer(s), hidden {w['hidden']}, intermediate {w['intermediate']}, "
        f"q4f16_1 weights as constants ({7 * args.layers} projections)"
    )
    best: Dict[str, Dict[str, Any]] = {}
    for _ in range(args.repeat):
        for variant in VARIANTS:
            result = run_worker(
                __file__, {"variant": variant, "layers": args.layers, "divisor": args.divisor}
            )
            keep_best(best, variant, result)
    print(f"imported: {best['stock']['constant_bytes_before'] / MIB:.1f} MiB of constants")
    print(
        f"{'variant':11} {'fold s':>8} {'constants after':>16} {'dequantize kept':>16} "
        f"{'peak RSS':>10} {'rise':>10}"
    )
    for variant in VARIANTS:
        r = best[variant]
        print(
            f"{variant:11} {r['seconds']:8.2f} {r['constant_bytes'] / MIB:12.1f} MiB "
            f"{r['dequantize_kept']:>10d} of {r['projections']:<3d} "
            f"{r['peak_kib'] / 1024:6.0f} MiB {r['delta_kib'] / 1024:6.0f} MiB"
        )
    stock, ours = best["stock"], best["fold_guard"]
    print(
        f"fold_guard / stock: time {ours['seconds'] / stock['seconds']:.2f}x, constants "
        f"{ours['constant_bytes'] / stock['constant_bytes']:.3f}x, peak RSS "
        f"{ours['peak_kib'] / stock['peak_kib']:.2f}x (rise {ours['delta_kib'] / max(1, stock['delta_kib']):.2f}x)"
    )


if __name__ == "__main__":
    main()
