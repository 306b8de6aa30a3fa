#!/usr/bin/env python
"""Fold the ``onnx`` wheel's model-zoo CNNs with fold_guard's ``default`` and with stock, against
the floor of copying the folded bytes once.

The nine real models of ``onnx.backend.test.case.model.collect_testcases()`` (``_common/onnx_zoo``):
their weights are ``ConstantOfShape`` subgraphs, imported by ``from_onnx(...,
keep_params_in_input=False)`` as ``broadcast_to(<one-element constant>, shape)``, which fold into
4.7-548 MiB of float32. With ``--pytorch-converted`` also the wheel's small PyTorch-exported
models that import. Every run is a fresh process (``_harness.run_worker``) that loads and imports
the model (not timed), reads its RSS, times the fold alone and reads its peak RSS:

* ``stock``: ``relax.transform.FoldConstant()``;
* ``cold``: ``fold_guard.relax.fold(mod, policy="default")`` with an empty kernel cache directory;
* ``warm``: the same with the directory the cold run filled;
* ``settled``: the cold fold again, after a fold of a tiny module in the same process (not
  timed; its own kernel cache): the peak without the few MiB TVM allocates on its first
  legalization in a process, which a small model's bound cannot hold;
* ``floor``: no fold: the folded constants' sizes (read from stock's output) copied once each
  with NumPy into fresh memory (``np.copyto`` into ``np.empty``), all kept alive as a fold keeps
  them: the memory-speed floor of writing the result, measured in the same run.

Each fold_guard run checks its output against stock's (``tvm_ffi.structural_equal``, constants'
bytes included) after its peak is read. A cold run that compiled kernels times each one's build
alone, afterwards (``slowest compile``). The script exits non-zero if an output differs.

Columns: ``stock s``, ``cold s``, ``warm s`` (min over ``--repeat``); ``x cold`` / ``x warm`` =
stock / fold_guard; ``floor s`` and ``cold/floor``; ``peak MiB`` (``VmHWM``) stock / cold;
``Δ cold`` = cold peak minus the RSS just before the fold, ``Δ settled`` the same for the
``settled`` run; ``bound`` = 1.1 x the module's constant bytes after the fold, the most ``Δ`` may
be; ``kernels`` compiled by the cold run and
the ``slowest compile`` of one of them alone.

Run: .venv/bin/python bench/bench_model_zoo.py                     # the nine: 4-6 minutes here
     .venv/bin/python bench/bench_model_zoo.py --models vgg19 --repeat 3
     .venv/bin/python bench/bench_model_zoo.py --pytorch-converted  # and the small ones
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

from _harness import keep_best, peak_rss_kib, rss_kib, run_worker

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

MIB = float(1 << 20)
FOLDS = ("stock", "cold", "warm", "settled")
#: The peak bound of issue 40: the RSS before the fold plus this much of the constants after it.
PEAK_FACTOR = 1.1


# --------------------------------------------------------------------------- worker


def _constants(mod: Any) -> Dict[int, int]:
    """The tensor constants of ``mod``'s Relax functions: handle -> bytes."""
    from tvm import relax

    from fold_guard.relax import _compat

    found: Dict[int, int] = {}

    def visit(node: Any) -> None:
        if _compat.is_constant(node):
            found[_compat.handle(node)] = _nbytes(_compat.constant_array(node))

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def _nbytes(tensor: Any) -> int:
    import numpy as np

    count = 1
    for dim in tensor.shape:
        count *= int(dim)
    return count * np.dtype(str(tensor.dtype)).itemsize


def _slowest_compile(mod: Any, cache: str) -> Tuple[int, float]:
    """How many distinct kernels the fast engine builds for ``mod``, and the slowest build alone."""
    import tvm

    from fold_guard._core.planner import plan_folds
    from fold_guard._core.report import StepTimer
    from fold_guard.relax._config import resolve_options
    from fold_guard.relax._engine.strategy import Way, choose_strategies
    from fold_guard.relax._translate import analyse

    analysis = analyse(mod, "default", StepTimer())
    plan = plan_folds(analysis.graph, analysis.policy)
    options = resolve_options(kernel_cache=cache)
    chosen = choose_strategies(
        plan, analysis.graph, analysis.translation.sites, analysis.kernels, options
    )
    kernels = {
        (id(s.kernel), s.target): s for s in chosen.values() if s.way is Way.KERNEL and s.kernel
    }
    slowest = 0.0
    for strategy in kernels.values():
        assert strategy.kernel is not None
        func = strategy.kernel.prim_func.with_attr("global_symbol", "k")
        start = time.perf_counter()
        built = tvm.tirx.build(tvm.IRModule({"k": func}), target=strategy.target)
        built["k"]  # the JIT's code generation happens here
        slowest = max(slowest, time.perf_counter() - start)
    return len(kernels), slowest


def _settle() -> None:
    """Fold a tiny module (a fill, a copy, a kernel), then reset the peak RSS counter."""
    import gc

    import numpy as np
    from tvm import relax

    import fold_guard.relax as fgr

    x = relax.Var("x", relax.TensorType((2,), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            one = relax.const(np.ones(1, "float32"))
            calls = [
                relax.op.broadcast_to(one, relax.ShapeExpr([3, 4])),
                relax.op.reshape(relax.const(np.ones(4, "float32")), (2, 2)),
                relax.op.exp(one),
            ]
            out = builder.emit_output(relax.Tuple([x, *[builder.emit(c) for c in calls]]))
        builder.emit_func_output(out)
    fgr.fold(builder.get(), kernel_cache=False)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # VmHWM := VmRSS (proc(5))


def worker(args: argparse.Namespace) -> int:
    if args.impl == "floor":
        return floor_worker(args)
    import onnx
    import tvm
    import tvm_ffi
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    import fold_guard.relax as fgr

    mod = from_onnx(onnx.load(args.onnx), keep_params_in_input=False)
    stock_pass = relax.transform.FoldConstant()  # registry lookup outside the timed region
    if args.impl == "settled":
        _settle()
    before = rss_kib()
    start = time.perf_counter()
    if args.impl == "stock":
        out = stock_pass(mod)
        seconds = time.perf_counter() - start
        info: Dict[str, Any] = {}
    else:
        result = fgr.fold(mod, policy="default", kernel_cache=args.cache)
        seconds = time.perf_counter() - start
        out = result.mod
        info = {
            "kernels_compiled": int(result.report.kernels_compiled),
            "kernels_cached": int(result.report.kernels_cached),
            "fallbacks": list(result.report.fallbacks),
        }
    peak = peak_rss_kib()
    inputs = _constants(mod)
    outputs = _constants(out)
    info.update(
        seconds=seconds,
        rss_before_kib=before,
        peak_kib=peak,
        delta_kib=max(0, peak - before),
        constants_after=sum(outputs.values()),
        folded_sizes=[size for handle, size in outputs.items() if handle not in inputs],
    )
    if args.impl == "stock":
        with open(args.out, "w") as handle:
            handle.write(tvm.ir.save_json(out))
    else:
        with open(args.stock) as handle:
            stock = tvm.ir.load_json(handle.read())
        info["equal"] = bool(tvm_ffi.structural_equal(stock, out))
        if args.impl == "cold" and info["kernels_compiled"]:
            info["kernels"], info["slowest_compile"] = _slowest_compile(mod, args.cache)
    print("RESULT " + json.dumps(info), flush=True)
    return 0


def floor_worker(args: argparse.Namespace) -> int:
    """Copy buffers of the folded constants' sizes once each into fresh memory, timed."""
    import numpy as np

    with open(args.sizes) as handle:
        sizes = json.load(handle)
    sources = [np.ones(size, np.uint8) for size in sizes]  # written: resident before the clock
    copies = []
    start = time.perf_counter()
    for source in sources:
        target = np.empty_like(source)
        np.copyto(target, source)
        copies.append(target)
    seconds = time.perf_counter() - start
    print("RESULT " + json.dumps({"seconds": seconds, "peak_kib": 0, "delta_kib": 0}), flush=True)
    return 0


# --------------------------------------------------------------------------- parent


def measure(name: str, path: str, repeat: int, tmpdir: str) -> Dict[str, Dict[str, Any]]:
    """min over ``repeat`` of each fold and of the floor, for one model."""
    script = os.path.abspath(__file__)
    best: Dict[str, Dict[str, Any]] = {}
    equal = True
    stock_out = os.path.join(tmpdir, f"{name}-stock.json")
    cache = os.path.join(tmpdir, f"cache-{name}")
    for r in range(repeat):
        for impl in FOLDS:
            # cold: a fresh directory; warm: the one cold filled; settled: one of its own
            run_cache = f"{cache}-{r}" if impl != "settled" else f"{cache}-{r}-settled"
            options = {"onnx": path, "impl": impl, "cache": run_cache, "stock": stock_out}
            if impl == "stock":
                options["out"] = stock_out if r == 0 else os.path.join(tmpdir, "stock-again.json")
            result = run_worker(script, options)
            equal = equal and (impl == "stock" or bool(result["equal"]))
            keep_best(best, impl, result)
        sizes = os.path.join(tmpdir, f"{name}-sizes.json")
        with open(sizes, "w") as handle:
            json.dump(best["stock"]["folded_sizes"], handle)
        keep_best(best, "floor", run_worker(script, {"impl": "floor", "sizes": sizes}))
    if os.path.exists(stock_out):
        os.unlink(stock_out)
    best["cold"]["equal"] = equal
    return best


def _row(name: str, best: Dict[str, Dict[str, Any]]) -> Tuple[str, bool]:
    stock, cold, warm, floor = best["stock"], best["cold"], best["warm"], best["floor"]
    settled = best["settled"]["delta_kib"] / 1024.0
    folded = sum(stock["folded_sizes"]) / MIB
    bound = PEAK_FACTOR * cold["constants_after"] / MIB
    delta = cold["delta_kib"] / 1024.0
    equal = bool(cold["equal"])  # every fold_guard run of the model, cold and warm
    kernels = cold.get("kernels_compiled", 0)
    slowest = f"{cold['slowest_compile']:.3f}" if kernels else "-"
    line = (
        f"| {name} | {folded:.1f} | {stock['seconds']:.2f} | {cold['seconds']:.3f} "
        f"| {warm['seconds']:.3f} | {stock['seconds'] / cold['seconds']:.1f}x "
        f"| {stock['seconds'] / warm['seconds']:.1f}x | {floor['seconds']:.3f} "
        f"| {cold['seconds'] / floor['seconds']:.2f} "
        f"| {stock['peak_kib'] / 1024:.0f} / {cold['peak_kib'] / 1024:.0f} "
        f"| {delta:.1f} | {settled:.1f} | {bound:.1f} "
        f"| {'yes' if delta <= bound else 'settled' if settled <= bound else 'NO'} "
        f"| {kernels} | {slowest} | {'EQUAL' if equal else 'DIFFERENT'} |"
    )
    return line, bool(equal)


def _nothing_to_fold(path: str) -> str:
    """Why a model is left out ("" if it imports and has calls that fold), planned here."""
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    import fold_guard.relax as fgr

    try:
        mod = from_onnx(onnx.load(path), keep_params_in_input=False)
    except Exception as err:  # noqa: BLE001 - a model Relax's importer rejects
        return f"does not import ({type(err).__name__})"
    return "" if fgr.plan(mod).folded else "nothing folds"


def main(argv: Optional[List[str]] = None) -> int:
    from _common.onnx_zoo import ZOO_MODELS, pytorch_converted_models, zoo_model_paths

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=list(ZOO_MODELS), default=list(ZOO_MODELS))
    p.add_argument("--repeat", type=int, default=1, help="min over k runs (default 1)")
    p.add_argument(
        "--pytorch-converted",
        action="store_true",
        help="also the wheel's PyTorch-exported models that import",
    )
    # hidden worker flags
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for flag in ("onnx", "impl", "out", "cache", "stock", "sizes"):
        p.add_argument(f"--{flag}", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)

    models = [(name, zoo_model_paths()[name]) for name in args.models]
    skipped: List[str] = []
    if args.pytorch_converted:
        for path in pytorch_converted_models():
            name = os.path.basename(os.path.dirname(path))
            why = _nothing_to_fold(path)
            if why:
                skipped.append(f"{name}: {why}")
            else:
                models.append((name, path))
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    rows, all_equal = [], True
    with tempfile.TemporaryDirectory(prefix="fold_guard_zoo_") as tmpdir:
        for name, path in models:
            print(f"... {name}", file=sys.stderr, flush=True)
            try:
                best = measure(name, path, args.repeat, tmpdir)
            except RuntimeError as err:  # a worker failed: say so, go on
                skipped.append(f"{name}: {str(err).splitlines()[0][:120]}")
                continue
            line, equal = _row(name, best)
            rows.append(line)
            all_equal = all_equal and equal
    print()
    print(
        "| model | folded MiB | stock s | cold s | warm s | x cold | x warm | floor s | cold/floor "
        "| peak MiB stock / cold | Δ cold MiB | Δ settled MiB | bound MiB | within | kernels "
        "| slowest compile s | equal? |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|")
    print("\n".join(rows))
    if skipped:
        print(f"\nleft out ({len(skipped)}):")
        print("\n".join(f"  {line}" for line in skipped))
    print()
    print(
        "x cold / x warm = stock s / fold_guard s (the fold alone, min over --repeat fresh "
        "processes); floor = the folded constants copied once each with NumPy into fresh memory; "
        f"bound = {PEAK_FACTOR} x the constants after the fold, the most Δ (peak minus the RSS "
        "before the fold) may be (within: yes; settled: only once a tiny fold ran first); "
        "slowest compile = one kernel of the cold fold built alone"
    )
    print(f"load average at the end: {os.getloadavg()}")
    print("command: " + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]))
    if not all_equal:
        print("ERROR: fold_guard output differs from stock FoldConstant", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
