#!/usr/bin/env python
"""Gigabyte-scale folding: time and peak memory of fold_guard vs stock on a large transformer-like model.

The model is ``layers`` blocks of four (hidden, hidden) fp32 weight matrices (attention q, k, v,
output projection), each as ``quantize(<fp32 const>) -> dequantize -> matmul`` on the activation,
the form an ONNX QDQ import with fp32 weights has. ``--hidden 2048 --layers 16`` is 1 GiB of fp32
weights. Folded under ``default`` (stock folds the same: every weight becomes an fp32 constant)
and ``keep-qdq-weights`` (every weight becomes an int8 constant under its dequantize).

Every (size, implementation) runs in a fresh process (``_harness.run_worker``); the worker builds
the model (not timed), then times the fold and reads its peak RSS (``VmHWM``: see
``_harness.peak_rss_kib``). The printed ``bound`` is
``1.5 x (input + output constant bytes) + the worker's RSS before the fold`` (the process baseline
plus the model it was handed). Growth: the time at 2N layers over the time at N.
fold_guard's output is checked structurally equal to stock's under ``default``.

Run: .venv/bin/python bench/bench_gigabyte.py                # 8 and 16 layers of 2048 (0.5, 1 GiB)
     .venv/bin/python bench/bench_gigabyte.py --stock-max-layers 8   # stock only up to 8 layers
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

GIB = 1 << 30


def build_model(layers: int, hidden: int, seed: int = 0):
    import tvm  # noqa: F401
    from tvm import relax

    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, hidden), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            act = x
            for _ in range(layers * 4):
                weight = rng.standard_normal((hidden, hidden), dtype=np.float32)
                scale = (np.abs(weight).max(axis=1) / 127.0).astype("float32")
                zero = np.zeros(hidden, "int8")
                q = bb.emit(
                    relax.op.quantize(
                        relax.const(weight), relax.const(scale), relax.const(zero), axis=0
                    )
                )
                dq = bb.emit(relax.op.dequantize(q, relax.const(scale), relax.const(zero), axis=0))
                act = bb.emit(relax.op.matmul(act, dq))
            out = bb.emit_output(act)
        bb.emit_func_output(out)
    return bb.get()


def constant_bytes(mod) -> int:
    import tvm
    from tvm import relax

    total = [0]

    def visit(node: Any) -> None:
        if isinstance(node, tvm.ir.GenericConst) and isinstance(node.value, tvm.runtime.Tensor):
            total[0] += int(np.prod(node.value.shape)) * np.dtype(str(node.value.dtype)).itemsize

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return total[0]


def worker(args: argparse.Namespace) -> int:
    import tvm
    from tvm import relax

    import fold_guard.relax as fgr

    mod = build_model(args.layers, args.hidden)
    stock = relax.transform.FoldConstant()
    rss_before = rss_kib()
    start = time.perf_counter()
    if args.impl == "stock":
        out = stock(mod)
    else:
        out = fgr.fold(mod, policy=args.policy, kernel_cache=False).mod
    seconds = time.perf_counter() - start
    peak = peak_rss_kib()
    result: Dict[str, Any] = {
        "seconds": seconds,
        "peak_kib": peak,
        "delta_kib": max(0, peak - rss_before),
        "rss_before_kib": rss_before,
        "in_bytes": constant_bytes(mod),
        "out_bytes": constant_bytes(out),
    }
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(tvm.ir.save_json(out))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument(
        "--layers", type=int, nargs="+", default=[8, 16], help="sizes N (default 8 16)"
    )
    parser.add_argument(
        "--stock-max-layers", type=int, default=16, help="skip stock above this size"
    )
    parser.add_argument("--policies", nargs="+", default=["default", "keep-qdq-weights"])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    parser.add_argument("--policy", default="default", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        args.layers = args.layers[0]
        return worker(args)

    import tvm
    import tvm_ffi

    script = os.path.abspath(__file__)
    rows = []
    pending = []
    failed = False
    with tempfile.TemporaryDirectory(prefix="fold_guard_gib_") as tmp:
        for layers in args.layers:
            base = {"hidden": args.hidden, "layers": layers}
            stock = None
            if layers <= args.stock_max_layers:
                stock_path = os.path.join(tmp, f"stock-{layers}.json")
                print(f"... stock, {layers} layers", file=sys.stderr, flush=True)
                stock = run_worker(script, {**base, "impl": "stock", "out": stock_path})
                rows.append((layers, "stock", "default", stock))
            for policy in args.policies:
                path = os.path.join(tmp, f"ours-{layers}-{policy}.json")
                print(f"... fold_guard {policy}, {layers} layers", file=sys.stderr, flush=True)
                ours = run_worker(script, {**base, "impl": "ours", "policy": policy, "out": path})
                if stock is not None and policy == "default":
                    pending.append((ours, stock_path, path))
                else:
                    os.unlink(path)
                rows.append((layers, "fold_guard", policy, ours))
        # After every worker has run: this process loads gigabytes to compare, and no worker may
        # start while it holds them (they would compete for memory on a 24 GiB machine).
        for ours, stock_path, path in pending:
            with open(stock_path) as a, open(path) as b:
                ours["equal"] = bool(
                    tvm_ffi.structural_equal(tvm.ir.load_json(a.read()), tvm.ir.load_json(b.read()))
                )
            failed |= not ours["equal"]

    print()
    print(
        "| layers | fp32 weights GiB | impl | policy | seconds | vs stock "
        "| peak MiB | bound MiB | within bound | equal |"
    )
    print("|---:|---:|---|---|---:|---:|---:|---:|---|---|")
    stock_seconds = {layers: r["seconds"] for layers, impl, _, r in rows if impl == "stock"}
    for layers, impl, policy, r in rows:
        bound_kib = (
            1.5 * (r["in_bytes"] + r["out_bytes"]) / 1024
            + r["rss_before_kib"]
            - r["in_bytes"] / 1024
        )
        ratio = f"{stock_seconds[layers] / r['seconds']:.1f}x" if layers in stock_seconds else "-"
        within = "yes" if r["peak_kib"] <= bound_kib else "NO"
        print(
            f"| {layers} | {r['in_bytes'] / GIB:.2f} | {impl} | {policy} | {r['seconds']:.2f} "
            f"| {ratio} | {r['peak_kib'] / 1024:.0f} | {bound_kib / 1024:.0f} | {within} "
            f"| {r.get('equal', '-')} |"
        )
    sizes = sorted(args.layers)
    for impl, policy in {(impl, policy) for _, impl, policy, _ in rows}:
        times = {layers: r["seconds"] for layers, i, p, r in rows if (i, p) == (impl, policy)}
        for small, large in zip(sizes, sizes[1:]):
            if small in times and large in times and large == 2 * small:
                print(
                    f"growth {impl} {policy}: time({large}) / time({small}) = {times[large] / times[small]:.2f}"
                )
    print(
        "bound = 1.5 x (input + output constant bytes) + the worker's RSS before the fold less the "
        "input it holds (the process baseline)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
