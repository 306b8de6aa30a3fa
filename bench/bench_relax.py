#!/usr/bin/env python
"""Time fold_guard's Relax FoldConstant against stock ``tvm.relax.transform.FoldConstant``.

Every (model, implementation, repeat) runs in a fresh subprocess (this script re-invoked with the
hidden ``--worker`` flag), so peak RSS is per run. The worker builds the model, records its RSS,
times the fold alone, records peak RSS, and saves the folded module with ``tvm.ir.save_json``.
The parent loads the stock and fold_guard outputs and checks ``tvm_ffi.structural_equal``.
fold_guard runs cold (a fresh process and an empty kernel cache: ``ours``) and warm (a fresh
process whose kernel cache the cold run filled: ``warm``).

Run ``python bench/bench_relax.py --help`` for the options; see bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time

import numpy as np
from _harness import fold_fields, keep_best, peak_rss_kib, rss_kib, run_worker

#: examples/_common: the QDQ ONNX models the examples, the benchmarks and the tests share.
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
)

IMPLS = ("stock", "ours", "warm")
DEFAULT_BLOCKS = (25, 50, 100, 200)
QUICK_BLOCKS = (25, 50)
SEED = 0
SAME_DIM = 64
DISTINCT_BASE = 16


# --------------------------------------------------------------------------- models


def make_synthetic(blocks: int, regime: str, seed: int = SEED):
    """A chain of ``blocks`` Q/DQ weight blocks in one dataflow block of ``main``.

    Block i: fp32 constant weight W_i -> R.quantize(W_i, scale_i, zp_i, axis=0, int8) ->
    R.dequantize(..., axis=0, float32) -> x = R.matmul(x, dq_i). The scale is per output
    channel (axis 0) and computed from the weight (max |w| / 127), so every block's scales differ.

    ``same``: every weight is (64, 64) and x stays (1, 64) (transformer-like repeated layers).
    ``distinct``: weight i is (16+i, 17+i), x goes (1, 16) -> (1, 17) -> ... (every shape distinct,
    CNN-like).
    """
    from tvm import relax

    if regime not in ("same", "distinct"):
        raise ValueError(regime)
    rng = np.random.default_rng(seed)

    def dims(i):
        if regime == "same":
            return SAME_DIM, SAME_DIM
        return DISTINCT_BASE + i, DISTINCT_BASE + i + 1

    in_dim = dims(0)[0]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, in_dim), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for i in range(blocks):
                rows, cols = dims(i)
                w = (rng.standard_normal((rows, cols)) * np.sqrt(1.0 / rows)).astype("float32")
                scale = (np.abs(w).max(axis=1) / 127.0).astype("float32")
                scale = np.maximum(scale, np.float32(1e-8))
                zp = np.zeros((rows,), dtype="int8")
                q = bb.emit(
                    relax.op.quantize(
                        relax.const(w),
                        relax.const(scale),
                        relax.const(zp),
                        axis=0,
                        out_dtype="int8",
                    )
                )
                dq = bb.emit(
                    relax.op.dequantize(
                        q, relax.const(scale), relax.const(zp), axis=0, out_dtype="float32"
                    )
                )
                if i == blocks - 1:
                    h = bb.emit_output(relax.op.matmul(h, dq))
                else:
                    h = bb.emit(relax.op.matmul(h, dq))
        bb.emit_func_output(h)
    return bb.get()


#: The QDQ ONNX models of examples/_common/onnx_models.py (weights as fp32 initializers feeding
#: QuantizeLinear, as a frontend leaves them), benchmarked after the synthetic ones.
ONNX_MODELS = ("qdq_cnn", "residual_cnn", "transformer_block")


def make_onnx_model(name: str):
    from _common.onnx_models import MODEL_BUILDERS, import_relax

    return import_relax(MODEL_BUILDERS[name](0, float_weights=True))


def build_model(model: str, regime: str, blocks: int):
    if model in ONNX_MODELS:
        return make_onnx_model(model)
    return make_synthetic(blocks, regime)


# --------------------------------------------------------------------------- worker


def worker(args) -> int:
    import tvm
    from tvm import relax

    import fold_guard.relax as fgr

    mod = build_model(args.model, args.regime, args.blocks)
    # Make sure the stock pass's registry lookup and fold_guard's imports happen before timing.
    stock_pass = relax.transform.FoldConstant()
    rss_before = rss_kib()
    maxrss_before = peak_rss_kib()
    info = {}
    if args.impl == "stock":
        t0 = time.perf_counter()
        out = stock_pass(mod)
        seconds = time.perf_counter() - t0
    else:
        # fgr.FoldConstant() is a module pass whose transform_module is `fold(mod, ...).mod`;
        # calling fold() directly times the same work and also gives the per-step report.
        t0 = time.perf_counter()
        result = fgr.fold(mod, policy=args.policy, kernel_cache=args.cache)
        seconds = time.perf_counter() - t0
        out = result.mod
        info = fold_fields(result)
    maxrss_after = peak_rss_kib()
    tvm.ir.save_json  # noqa: B018 - make sure it exists before writing
    with open(args.out, "w") as f:
        f.write(tvm.ir.save_json(out))
    info.update(
        seconds=seconds,
        peak_kib=maxrss_after,
        rss_before_kib=rss_before,
        maxrss_before_kib=maxrss_before,
        delta_kib=max(0, maxrss_after - rss_before),
    )
    print("RESULT " + json.dumps(info), flush=True)
    return 0


# --------------------------------------------------------------------------- parent


def run_one(model, regime, blocks, impl, out_path, policy, cache):
    options = {
        "model": model,
        "regime": regime,
        "n": blocks,
        "impl": impl,
        "out": out_path,
        "policy": policy,
        "cache": cache,
    }
    return run_worker(os.path.abspath(__file__), options)


def measure(model, regime, blocks, repeat, tmpdir, policy):
    """min over `repeat` runs of each implementation; returns per-impl results and equality."""
    import tvm
    import tvm_ffi

    best = {}
    outs = {}
    for impl in IMPLS:
        for r in range(repeat):
            path = os.path.join(tmpdir, f"{model}-{regime}-{blocks}-{impl}-{r}.json")
            # cold: an empty cache per run; warm: the cache the first cold run filled
            cache = os.path.join(
                tmpdir, f"cache-{model}-{regime}-{blocks}-{r if impl != 'warm' else 0}"
            )
            res = run_one(model, regime, blocks, impl, path, policy, cache)
            keep_best(best, impl, res)
            outs.setdefault(impl, path)
    with open(outs["stock"]) as f:
        stock_out = tvm.ir.load_json(f.read())
    equal = True
    for impl in ("ours", "warm"):
        with open(outs[impl]) as f:
            equal &= bool(tvm_ffi.structural_equal(stock_out, tvm.ir.load_json(f.read())))
    return best, equal


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--blocks",
        type=int,
        nargs="+",
        default=list(DEFAULT_BLOCKS),
        help="numbers of Q/DQ blocks for the synthetic models (default: 25 50 100 200)",
    )
    p.add_argument("--repeat", type=int, default=1, help="take the min over k runs (default 1)")
    p.add_argument("--quick", action="store_true", help="blocks 25 and 50 only")
    p.add_argument(
        "--regimes", nargs="+", default=["same", "distinct"], choices=["same", "distinct"]
    )
    p.add_argument(
        "--no-cnn",
        action="store_true",
        help="skip the QDQ ONNX models (CNN, residual CNN, transformer block)",
    )
    p.add_argument("--policy", default="default", help=argparse.SUPPRESS)
    p.add_argument(
        "--steps",
        action="store_true",
        help="also print fold_guard's per-step seconds and kernels compiled",
    )
    # hidden worker flags
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", default="synthetic", help=argparse.SUPPRESS)
    p.add_argument("--regime", default="same", help=argparse.SUPPRESS)
    p.add_argument("--n", dest="n", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--impl", choices=IMPLS, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--cache", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker:
        args.blocks = args.n
        return worker(args)

    blocks = list(QUICK_BLOCKS) if args.quick else args.blocks
    cases = [("synthetic", regime, n) for regime in args.regimes for n in blocks]
    if not args.no_cnn:
        cases += [(name, "distinct", 0) for name in ONNX_MODELS]

    rows = []
    any_diff = False
    with tempfile.TemporaryDirectory(prefix="fold_guard_bench_") as tmpdir:
        for model, regime, n in cases:
            label = f"{model} {regime} {n if model == 'synthetic' else '-'}"
            print(f"... {label}", file=sys.stderr, flush=True)
            best, equal = measure(model, regime, n, args.repeat, tmpdir, args.policy)
            any_diff |= not equal
            rows.append((model, regime, n, best, equal))

    mib = lambda kib: kib / 1024.0  # noqa: E731
    print()
    print(
        "| model | regime | blocks | stock s | ours s | speedup | warm s | warm speedup | stock peak MiB "
        "| ours peak MiB | mem ratio | stock Δ MiB | ours Δ MiB | equal? |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for model, regime, n, best, equal in rows:
        s, o, w = best["stock"], best["ours"], best["warm"]
        print(
            f"| {model} | {regime if model == 'synthetic' else 'onnx'} | {n if model == 'synthetic' else '-'} "
            f"| {s['seconds']:.3f} | {o['seconds']:.3f} | {s['seconds'] / o['seconds']:.1f}x "
            f"| {w['seconds']:.3f} | {s['seconds'] / w['seconds']:.1f}x "
            f"| {mib(s['peak_kib']):.0f} | {mib(o['peak_kib']):.0f} | {o['peak_kib'] / s['peak_kib']:.2f} "
            f"| {mib(s['delta_kib']):.1f} | {mib(o['delta_kib']):.1f} "
            f"| {'EQUAL' if equal else 'DIFFERENT'} |"
        )
    if args.steps:
        print()
        print(
            "| model | regime | blocks | folded | kernels compiled | "
            + " | ".join(("walk", "legalize", "plan", "compile", "evaluate", "rewrite"))
            + " |"
        )
        print("|---|---|---:|---:|---:|" + "---:|" * 6)
        for model, regime, n, best, _ in rows:
            o = best["ours"]
            st = o.get("steps", {})
            print(
                f"| {model} | {regime if model == 'synthetic' else 'onnx'} | {n if model == 'synthetic' else '-'} "
                f"| {o.get('folded', '?')} | {o.get('kernels_compiled', '?')} | "
                + " | ".join(
                    f"{st.get(k, float('nan')):.3f}"
                    for k in ("walk", "legalize", "plan", "compile", "evaluate", "rewrite")
                )
                + " |"
            )
    print()
    print(
        "speedup = stock s / ours s (wall time of the pass only, min over --repeat runs; ours: "
        "empty kernel cache, warm: the cache a cold run filled); "
        "peak = VmHWM of the worker process; Δ = peak minus RSS just before the pass; "
        "mem ratio = ours peak / stock peak"
    )
    print("command: " + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]))
    if any_diff:
        print("ERROR: fold_guard output differs from stock FoldConstant", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
