#!/usr/bin/env python
"""Fold real-model shapes with fold_guard's Relax FoldConstant and with stock, cold and warm.

The models (bench/real_models.py) have the layer and weight shapes of ResNet-50, MobileNetV2,
EfficientNet-B0, ViT-S/16 and BERT-tiny, quantized by onnxruntime in two forms (int8 weights;
fp32 weights feeding QuantizeLinear) and imported with
``relax.frontend.onnx.from_onnx(..., keep_params_in_input=False)``.

The parent builds and quantizes each model once and saves it as an ONNX file. Every run is a
fresh process (this script re-invoked with the hidden ``--worker`` flag, through
bench/_harness.py) that loads the file, imports it (not timed), times the fold alone, reads its
peak RSS and saves the folded module with ``tvm.ir.save_json``. Runs per (model, form):
``stock`` (``relax.transform.FoldConstant()``), ``cold`` (``fold_guard.relax.fold(mod,
policy="default")`` with an empty kernel cache directory) and ``warm`` (the same, with the cache
directory the first cold run filled); with ``--uncached`` also ``uncached`` (``kernel_cache=False``,
no cache at all). ``--compare-with DIR`` adds ``cold`` and ``warm`` runs of the fold_guard checkout
in DIR (put first on ``PYTHONPATH``), and ``--variant NAME:KEY=VALUE,...`` runs of this checkout
with engine options changed (``fold_guard.relax.EngineOptions``: one speed mechanism
switched off, say); each repeat runs every implementation once, in turn, so the variants
interleave (A/B/A/B). The parent checks that every fold_guard output is structurally equal to
stock's (``tvm_ffi.structural_equal``, which compares constant data too) and exits non-zero
otherwise.

Run ``python bench/bench_real_models.py --help`` for the options; see bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import real_models
from _harness import fold_fields, keep_best, peak_rss_kib, rss_kib, run_worker

#: examples/_common: the QDQ ONNX models the examples, the benchmarks and the tests share.
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
)

IMPLS = ("stock", "cold", "warm", "uncached")
#: what a worker runs: an IMPLS entry, without the checkout or variant it names
KINDS = IMPLS
STEPS = ("walk", "legalize", "plan", "compile", "evaluate", "rewrite")
#: --quick: the two smallest CNN-like and transformer-like models, int8 form only.
QUICK_MODELS = ("mobilenet_v2", "bert_tiny")


# --------------------------------------------------------------------------- worker


def worker(args: argparse.Namespace) -> int:
    import onnx
    import tvm
    from _common.onnx_models import import_relax
    from tvm import relax

    import fold_guard.relax as fgr

    fold_options: Dict[str, Any] = {}
    if args.engine:  # a variant: this checkout's engine with some options changed
        import dataclasses

        from fold_guard.relax._config import resolve_options

        changes = {k: _option_value(v) for k, v in (kv.split("=") for kv in args.engine.split(","))}
        base = resolve_options(kernel_cache=args.cache)
        fold_options["engine_options"] = dataclasses.replace(base, **changes)
    mod = import_relax(onnx.load(args.onnx))
    stock_pass = relax.transform.FoldConstant()  # registry lookup outside the timed region
    # peak_rss_kib, not ru_maxrss, which would report at least this parent's RSS (about 950 MiB
    # once it has quantized ResNet-50): see _harness.peak_rss_kib
    rss_before = rss_kib()
    info: Dict[str, Any] = {}
    t0 = time.perf_counter()
    if args.impl == "stock":
        out = stock_pass(mod)
        seconds = time.perf_counter() - t0
    else:
        # fgr.FoldConstant()'s transform_module is fold(mod, ...).mod; fold() also gives the report
        if not fold_options:
            fold_options["kernel_cache"] = False if args.impl == "uncached" else args.cache
        result = fgr.fold(mod, policy="default", **fold_options)
        seconds = time.perf_counter() - t0
        out = result.mod
        info = fold_fields(result)
    peak = peak_rss_kib()
    with open(args.out, "w") as f:
        f.write(tvm.ir.save_json(out))
    info.update(seconds=seconds, peak_kib=peak, delta_kib=max(0, peak - rss_before))
    info["fold_guard"] = os.path.dirname(os.path.dirname(os.path.abspath(fgr.__file__)))
    print("RESULT " + json.dumps(info), flush=True)
    return 0


# --------------------------------------------------------------------------- parent


def _option_value(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("0", "false", "off", "no"):
        return False
    if lowered in ("1", "true", "on", "yes"):
        return True
    return int(text)


def measure(
    onnx_path: str,
    label: str,
    impls: Sequence[str],
    repeat: int,
    tmpdir: str,
    *,
    trees: Optional[Dict[str, str]] = None,
    variants: Optional[Dict[str, str]] = None,
    stat: str = "min",
) -> Tuple[Dict[str, Dict[str, Any]], bool]:
    """min (or median) over ``repeat`` runs of each of ``impls``, and whether every fold_guard
    run equals stock.

    An impl ``cold@NAME`` / ``warm@NAME`` runs the checkout ``trees[NAME]``; ``cold:NAME`` /
    ``warm:NAME`` runs this checkout with the engine options ``variants[NAME]``. Every repeat
    runs each impl once, in the order given, so the implementations interleave.
    """
    import tvm
    import tvm_ffi

    runs: Dict[str, List[Dict[str, Any]]] = {}
    outs: Dict[str, str] = {}
    for r in range(repeat):
        for impl in impls:
            kind, _, name = impl.replace("@", ":").partition(":")
            out = os.path.join(tmpdir, f"{label}-{impl}-{r}.json")
            # cold: a fresh empty directory per run; warm: the one the first cold run filled
            cache_name = impl.replace("warm", "cold") if kind == "warm" else impl
            cache = os.path.join(tmpdir, f"cache-{label}-{cache_name}-{0 if kind == 'warm' else r}")
            options = {"onnx": onnx_path, "impl": kind, "out": out, "cache": cache}
            env = None
            if "@" in impl:
                env = dict(os.environ, PYTHONPATH=os.path.abspath((trees or {})[name]))
            elif ":" in impl:
                options["engine"] = (variants or {})[name]
            result = run_worker(os.path.abspath(__file__), options, env=env)
            runs.setdefault(impl, []).append(result)
            outs.setdefault(impl, out)
    best: Dict[str, Dict[str, Any]] = {}
    for impl, results in runs.items():
        for result in results:
            keep_best(best, impl, result)
        if stat == "median":
            best[impl]["seconds"] = statistics.median(r["seconds"] for r in results)
        best[impl]["all_seconds"] = [r["seconds"] for r in results]

    def load(path: str):
        with open(path) as f:
            return tvm.ir.load_json(f.read())

    stock = load(outs["stock"]) if "stock" in outs else None
    equal = stock is None or all(
        bool(tvm_ffi.structural_equal(stock, load(outs[impl]))) for impl in impls if impl != "stock"
    )
    return best, equal


def print_comparison(rows: List[Any], impls: Sequence[str]) -> None:
    """Per row, each implementation's seconds and, with stock, its ratio; else its time / ``cold``."""
    others = [impl for impl in impls if impl != "stock"]
    print()
    print("| model | form | " + " | ".join(f"{impl} s | ratio" for impl in others) + " |")
    print("|---|---|" + "---:|---:|" * len(others))
    for model, form, _, best, _ in rows:
        cells = []
        for impl in others:
            seconds = best[impl]["seconds"]
            if "stock" in best:
                ratio = f"{best['stock']['seconds'] / seconds:.1f}x"
            else:
                base = best["warm" if impl.startswith("warm") else "cold"]["seconds"]
                ratio = f"{seconds / base:.2f}"
            cells.append(f"{seconds:.3f} | {ratio}")
        print(f"| {model} | {form} | " + " | ".join(cells) + " |")


Row = Tuple[str, str, Dict[str, int], Dict[str, Dict[str, Any]], bool]


def print_tables(rows: List[Row]) -> None:
    uncached = all("uncached" in best for *_, best, _ in rows)
    mib = lambda kib: kib / 1024.0  # noqa: E731
    print()
    print(
        "| model | form | layers | fp32 weights MiB | folded calls | stock s | cold s | stock/cold "
        "| warm s | stock/warm "
        + ("| no-cache s | stock/no-cache " if uncached else "")
        + "| kernels compiled cold / cached warm | peak MiB stock / cold / warm | Δ MiB stock / cold / warm "
        "| equal? |"
    )
    print(
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        + ("---:|---:|" if uncached else "")
        + "---:|---:|---:|---|"
    )
    for model, form, stats, best, equal in rows:
        s, c, w = best["stock"], best["cold"], best["warm"]
        extra = ""
        if uncached:
            u = best["uncached"]
            extra = f"| {u['seconds']:.2f} | {s['seconds'] / u['seconds']:.1f}x "
        print(
            f"| {model} | {form} | {stats['layers']} | {stats['weight_bytes'] / 2**20:.1f} | {c['folded']} "
            f"| {s['seconds']:.2f} | {c['seconds']:.2f} | {s['seconds'] / c['seconds']:.1f}x "
            f"| {w['seconds']:.3f} | {s['seconds'] / w['seconds']:.0f}x {extra}"
            f"| {c['kernels_compiled']} / {w['kernels_cached']} "
            f"| {mib(s['peak_kib']):.0f} / {mib(c['peak_kib']):.0f} / {mib(w['peak_kib']):.0f} "
            f"| {mib(s['delta_kib']):.0f} / {mib(c['delta_kib']):.0f} / {mib(w['delta_kib']):.0f} "
            f"| {'EQUAL' if equal else 'DIFFERENT'} |"
        )
    print()
    print("| model | form | run | " + " | ".join(STEPS) + " |")
    print("|---|---|---|" + "---:|" * len(STEPS))
    for model, form, _, best, _ in rows:
        for impl in ("cold", "warm", "uncached"):
            if impl in best:
                steps = best[impl]["steps"]
                print(
                    f"| {model} | {form} | {impl} | "
                    + " | ".join(f"{steps.get(k, float('nan')):.3f}" for k in STEPS)
                    + " |"
                )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--models", nargs="+", choices=list(real_models.MODELS), default=list(real_models.MODELS)
    )
    p.add_argument(
        "--forms", nargs="+", choices=list(real_models.FORMS), default=list(real_models.FORMS)
    )
    p.add_argument("--repeat", type=int, default=1, help="take the min over k runs (default 1)")
    p.add_argument(
        "--quick", action="store_true", help=f"{' and '.join(QUICK_MODELS)}, int8 form only"
    )
    p.add_argument(
        "--uncached",
        action="store_true",
        help="also time fold_guard with kernel_cache=False (the in-memory JIT path)",
    )
    p.add_argument(
        "--compare-with",
        metavar="DIR",
        help="also time cold and warm folds of the fold_guard checkout in DIR, interleaved",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE,...",
        help="also time cold and warm folds with these engine options (repeatable)",
    )
    p.add_argument("--no-stock", action="store_true", help="skip stock (variants only)")
    p.add_argument("--median", action="store_true", help="median over --repeat, not min")
    # hidden worker flags
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--onnx", help=argparse.SUPPRESS)
    p.add_argument("--impl", choices=KINDS, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--cache", help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker:
        return worker(args)
    import onnx

    models, forms = (QUICK_MODELS, ("int8",)) if args.quick else (args.models, args.forms)
    impls = list(IMPLS if args.uncached else IMPLS[:-1])
    trees = {"before": args.compare_with} if args.compare_with else {}
    variants = dict(v.split(":", 1) for v in args.variant)
    for kind in ("cold", "warm"):
        at = impls.index(kind) + 1
        impls[at:at] = [f"{kind}@{name}" for name in trees]
        impls[at:at] = [f"{kind}:{name}" for name in variants]
    if args.no_stock:
        impls.remove("stock")
    compare = bool(trees or variants or args.no_stock)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fold_guard_real_") as tmpdir:
        for model in models:
            stats = real_models.model_stats(real_models.build_float(model))
            for form in forms:
                label = f"{model}-{form}"
                print(f"... {label}", file=sys.stderr, flush=True)
                path = os.path.join(tmpdir, f"{label}.onnx")
                onnx.save(real_models.build_quantized(model, form), path)
                best, equal = measure(
                    path,
                    label,
                    impls,
                    args.repeat,
                    tmpdir,
                    trees=trees,
                    variants=variants,
                    stat="median" if args.median else "min",
                )
                rows.append((model, form, stats, best, equal))
    if compare:
        print_comparison(rows, impls)
    else:
        print_tables(rows)
    print()
    print(
        "stock/cold, stock/warm = stock s / fold_guard s (wall time of the pass only, min over --repeat "
        "runs; cold: an empty kernel cache, warm: the cache a cold run filled, no-cache: kernel_cache=False); "
        "peak = VmHWM of the worker process (includes the ONNX import and the Python + TVM baseline); "
        "Δ = peak minus the RSS just before the pass; equal = every fold_guard output structurally "
        "equal to stock's"
    )
    print("command: " + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]))
    if not all(equal for *_, equal in rows):
        print("ERROR: fold_guard output differs from stock FoldConstant", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
