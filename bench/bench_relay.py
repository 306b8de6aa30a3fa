#!/usr/bin/env python
"""Time fold_guard's Relay FoldConstant against stock ``relay.transform.FoldConstant(fold_qnn=True)``.

Runs in the Relay environment (``.venv310``: Python 3.10, hhb-tvm 3.2.3 = TVM 0.16 with Relay).
Every (model, implementation, repeat) runs in a fresh subprocess (this script re-invoked with the
hidden ``--worker`` flag), so peak RSS is per run. The worker builds the model (not timed), times
the fold alone, records peak RSS and saves the folded module with ``tvm.ir.save_json``. The
parent loads the stock and fold_guard outputs and checks ``tvm.ir.structural_equal``.

Run ``python bench/bench_relay.py --help`` for the options; see bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from _harness import keep_best, peak_rss_kib, rss_kib, run_worker

#: examples/_common: the QDQ ONNX models the examples, the benchmarks and the tests share.
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
)

IMPLS = ("stock", "ours")
DEFAULT_BLOCKS = (25, 50, 100, 200)
QUICK_BLOCKS = (25, 50)
SEED = 0
SAME_DIM = 64
DISTINCT_BASE = 16
#: Scale of every int8 activation (the input and each requantize output).
ACT_SCALE = 0.05
#: fold_guard policy -> the stock pass it must reproduce (structurally equal output).
STOCK_FOR_POLICY = {"fold-qnn": {"fold_qnn": True}, "default": {}}
#: fold_guard's report steps, in pipeline order, when it reports per-step seconds.
STEP_ORDER = ("walk", "legalize", "plan", "compile", "evaluate", "rewrite")
#: The checkout this script belongs to. Workers import fold_guard from here (PYTHONPATH), so the
#: benchmark measures this tree whether or not fold_guard is pip-installed in the environment.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _child_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (REPO, env.get("PYTHONPATH"))))
    return env


# --------------------------------------------------------------------------- models


def _per_channel_weight(
    rng: np.random.Generator, shape: Tuple[int, ...]
) -> Tuple[np.ndarray, np.ndarray]:
    """A random fp32 weight and its symmetric int8 scale per output channel (axis 0)."""
    fan_in = int(np.prod(shape[1:]))
    w = (rng.standard_normal(shape) * np.sqrt(1.0 / fan_in)).astype("float32")
    scale = np.abs(w.reshape(shape[0], -1)).max(axis=1) / 127.0
    return w, np.maximum(scale, 1e-8).astype("float32")


def make_synthetic(blocks: int, regime: str, seed: int = SEED) -> Any:
    """A chain of ``blocks`` QNN dense blocks in ``main``, type-inferred.

    Block i (W_i an fp32 constant, x the int8 activation, s = 0.05 its scale)::

        w_q = qnn.quantize(W_i, scale_i, 0, axis=0, int8)          constant: fold_qnn folds it
        y   = qnn.dense(x, w_q, 0, 0, s, scale_i, units)            runtime input: stays
        x   = qnn.requantize(y, s * scale_i, 0, s, 0, axis=1, int8) runtime input: stays

    The weight scale is per output channel (max |w| / 127 of each row of a random weight), so
    every block's constants differ.

    ``same``: every weight is (64, 64) and x stays (1, 64) (transformer-like repeated layers).
    ``distinct``: weight i is (17+i, 16+i) (units, in), x goes (1, 16) -> (1, 17) -> ... (every
    shape distinct, CNN-like).
    """
    import tvm
    from tvm import relay

    if regime not in ("same", "distinct"):
        raise ValueError(regime)
    rng = np.random.default_rng(seed)

    def in_units(i: int) -> Tuple[int, int]:
        if regime == "same":
            return SAME_DIM, SAME_DIM
        return DISTINCT_BASE + i, DISTINCT_BASE + i + 1

    zero = relay.const(0, "int32")
    act_scale = relay.const(np.float32(ACT_SCALE))
    x = relay.var("x", shape=(1, in_units(0)[0]), dtype="int8")
    h = x
    for i in range(blocks):
        in_dim, units = in_units(i)
        w, w_scale = _per_channel_weight(rng, (units, in_dim))
        w_q = relay.qnn.op.quantize(
            relay.const(w), relay.const(w_scale), zero, axis=0, out_dtype="int8"
        )
        y = relay.qnn.op.dense(h, w_q, zero, zero, act_scale, relay.const(w_scale), units=units)
        h = relay.qnn.op.requantize(
            y,
            relay.const((ACT_SCALE * w_scale).astype("float32")),
            zero,
            act_scale,
            zero,
            axis=1,
            out_dtype="int8",
        )
    mod = tvm.IRModule.from_expr(relay.Function([x], h))
    return relay.transform.InferType()(mod)


#: (in channels, out channels) of the four convolutions of the CNN model.
CNN_CHANNELS = ((3, 8), (8, 8), (8, 16), (16, 16))


def make_cnn(seed: int = SEED) -> Any:
    """A 4-layer quantized CNN on a (1, 3, 16, 16) int8 image, type-inferred.

    Layer i: ``qnn.conv2d(x, qnn.quantize(W_i) [per channel, int8], 3x3, pad 1)`` ->
    ``nn.bias_add(., qnn.quantize(b_i, s * scale_i, axis=0, int32))`` -> ``qnn.requantize`` ->
    ``clip(0, 127)``. Two constant QNN calls per layer fold (weight and bias); the convolutions,
    requantizes and clips see the image and stay.
    """
    import tvm
    from tvm import relay

    rng = np.random.default_rng(seed)
    zero = relay.const(0, "int32")
    act_scale = relay.const(np.float32(ACT_SCALE))
    x = relay.var("x", shape=(1, CNN_CHANNELS[0][0], 16, 16), dtype="int8")
    h = x
    for cin, cout in CNN_CHANNELS:
        w, w_scale = _per_channel_weight(rng, (cout, cin, 3, 3))
        bias = (rng.standard_normal(cout) * 0.1).astype("float32")
        acc_scale = (ACT_SCALE * w_scale).astype("float32")
        w_q = relay.qnn.op.quantize(
            relay.const(w), relay.const(w_scale), zero, axis=0, out_dtype="int8"
        )
        b_q = relay.qnn.op.quantize(
            relay.const(bias), relay.const(acc_scale), zero, axis=0, out_dtype="int32"
        )
        y = relay.qnn.op.conv2d(
            h,
            w_q,
            zero,
            zero,
            act_scale,
            relay.const(w_scale),
            kernel_size=(3, 3),
            channels=cout,
            padding=(1, 1),
            out_dtype="int32",
        )
        y = relay.nn.bias_add(y, b_q, axis=1)
        y = relay.qnn.op.requantize(
            y, relay.const(acc_scale), zero, act_scale, zero, axis=1, out_dtype="int8"
        )
        h = relay.clip(y, 0, 127)
    mod = tvm.IRModule.from_expr(relay.Function([x], h))
    return relay.transform.InferType()(mod)


#: Float models from ``tvm.relay.testing`` (random weights, no download), on a 64x64 image.
ZOO_MODELS = ("resnet18", "mobilenet")


def make_zoo(name: str) -> Any:
    """A ``relay.testing`` workload with its parameters bound as constants, after SimplifyInference.

    This is how a frontend import looks to FoldConstant: every batch-norm has become constant
    arithmetic on the weights (no QNN), so ``fold-qnn`` and ``default`` fold the same calls.
    """
    import tvm
    from tvm import relay
    from tvm.relay import testing

    if name == "resnet18":
        mod, params = testing.resnet.get_workload(
            num_layers=18, batch_size=1, image_shape=(3, 64, 64)
        )
    else:
        mod, params = testing.mobilenet.get_workload(batch_size=1, image_shape=(3, 64, 64))
    func = relay.build_module.bind_params_by_name(mod["main"], params)
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    return relay.transform.SimplifyInference()(mod)


#: The QDQ ONNX models of ``_common.onnx_models`` after FakeQuantizationToInteger.
ONNX_MODELS = ("qdq_cnn", "residual_cnn", "transformer_block")


def make_fq2i(name: str) -> Any:
    """An onnxruntime-quantized QDQ model (fp32 weights feeding QuantizeLinear) imported with
    ``from_onnx`` and rewritten by ``FakeQuantizationToInteger``: the flow of the FQ2I post-step,
    where every weight is a ``qnn.quantize(<fp32 const>)`` under ``qnn.conv2d`` / ``qnn.dense``."""
    from _common.onnx_models import MODEL_BUILDERS, import_relay
    from tvm import relay

    mod = import_relay(MODEL_BUILDERS[name](0, float_weights=True))
    return relay.transform.FakeQuantizationToInteger()(mod)


def build_model(model: str, regime: str, blocks: int) -> Any:
    if model == "qnn_cnn":
        return make_cnn()
    if model.startswith("fq2i_"):
        return make_fq2i(model[len("fq2i_") :])
    if model in ZOO_MODELS:
        return make_zoo(model)
    return make_synthetic(blocks, regime)


# --------------------------------------------------------------------------- worker


def count_qnn_calls(mod: Any) -> int:
    """Calls to ``qnn.*`` ops in ``main``: shows the constant ones folded and the rest stayed."""
    import tvm
    from tvm import relay

    names: List[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op):
            names.append(str(node.op.name))

    relay.analysis.post_order_visit(mod["main"], visit)
    return sum(name.startswith("qnn.") for name in names)


def worker(args: argparse.Namespace) -> int:
    import tvm
    from tvm import relay

    # Import the adapter in both workers when it is available, so both start from the same RSS.
    fgr: Any = None
    try:
        import fold_guard.relay as fgr
    except ImportError:
        if args.impl == "ours":
            raise

    mod = build_model(args.model, args.regime, args.blocks)
    # Look the stock pass up before timing (and build ours), so timing covers the fold only.
    stock_pass = relay.transform.FoldConstant(**STOCK_FOR_POLICY[args.policy])
    rss_before = rss_kib()
    maxrss_before = peak_rss_kib()
    info: Dict[str, Any] = {}
    if args.impl == "stock":
        t0 = time.perf_counter()
        out = stock_pass(mod)
        seconds = time.perf_counter() - t0
    elif hasattr(fgr, "fold"):
        # fgr.FoldConstant(policy) is a module pass that runs fold(); calling fold() times the
        # same work and also returns the plan and the per-step report.
        t0 = time.perf_counter()
        result = fgr.fold(mod, policy=args.policy)
        seconds = time.perf_counter() - t0
        out = result.mod
        report = getattr(result, "report", None)
        info = {
            "steps": {k: float(v) for k, v in dict(getattr(report, "seconds", None) or {}).items()},
            "evaluation_runs": getattr(report, "evaluation_runs", None),
            "folded": len(result.plan.folded),
        }
    else:
        ours_pass = fgr.FoldConstant(args.policy)
        t0 = time.perf_counter()
        out = ours_pass(mod)
        seconds = time.perf_counter() - t0
    maxrss_after = peak_rss_kib()
    with open(args.out, "w") as f:
        f.write(tvm.ir.save_json(out))
    info.update(
        qnn_before=count_qnn_calls(mod),
        qnn_after=count_qnn_calls(out),
        seconds=seconds,
        peak_kib=maxrss_after,
        rss_before_kib=rss_before,
        maxrss_before_kib=maxrss_before,
        delta_kib=max(0, maxrss_after - rss_before),
    )
    print("RESULT " + json.dumps(info), flush=True)
    return 0


# --------------------------------------------------------------------------- parent


def run_one(
    model: str, regime: str, blocks: int, impl: str, out_path: str, policy: str
) -> Dict[str, Any]:
    options = {
        "model": model,
        "regime": regime,
        "n": blocks,
        "impl": impl,
        "out": out_path,
        "policy": policy,
    }
    return run_worker(os.path.abspath(__file__), options, cwd=REPO, env=_child_env())


def measure(
    model: str,
    regime: str,
    blocks: int,
    impls: Tuple[str, ...],
    repeat: int,
    tmpdir: str,
    policy: str,
) -> Tuple[Dict[str, Dict[str, Any]], Optional[bool]]:
    """Min over ``repeat`` runs of each implementation, and whether the outputs are equal."""
    import tvm

    best: Dict[str, Dict[str, Any]] = {}
    outs: Dict[str, str] = {}
    for impl in impls:
        for r in range(repeat):
            path = os.path.join(tmpdir, f"{model}-{regime}-{blocks}-{impl}-{r}.json")
            res = run_one(model, regime, blocks, impl, path, policy)
            keep_best(best, impl, res)
            outs.setdefault(impl, path)
    if len(outs) < 2:
        return best, None
    with open(outs["stock"]) as f:
        stock_out = tvm.ir.load_json(f.read())
    with open(outs["ours"]) as f:
        ours_out = tvm.ir.load_json(f.read())
    equal = bool(tvm.ir.structural_equal(stock_out, ours_out))
    if not equal:
        # Say where they first differ (TVM's message names the path), without its C++ traceback.
        try:
            tvm.ir.assert_structural_equal(stock_out, ours_out)
        except ValueError as err:
            where = next(
                (line for line in str(err).splitlines() if "caused by" in line), str(err)[:300]
            )
            print(f"DIFFERENT {model} {regime} {blocks}: {where}", file=sys.stderr, flush=True)
    return best, equal


def _adapter_import_error() -> Optional[str]:
    """None when ``fold_guard.relay`` imports in a fresh interpreter, else the error's last line."""
    proc = subprocess.run(
        [sys.executable, "-c", "import fold_guard.relay"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_child_env(),
        check=False,
    )
    if proc.returncode == 0:
        return None
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit code {proc.returncode}"


def _mib(kib: float) -> float:
    return kib / 1024.0


def format_row(
    model: str,
    regime: str,
    n: int,
    s: Dict[str, Any],
    o: Optional[Dict[str, Any]],
    equal: Optional[bool],
) -> str:
    """One table row; fold_guard's cells are "-" when it was not run."""
    per = n if n else len(CNN_CHANNELS) if model == "qnn_cnn" else 1
    cells = [model, regime, str(n or "-"), f"{s['seconds']:.3f}"]
    if o is None:
        cells += [
            "-",
            "-",
            f"{1000 * s['seconds'] / per:.0f}",
            "-",
            f"{_mib(s['peak_kib']):.0f}",
            "-",
            "-",
            f"{_mib(s['delta_kib']):.1f}",
            "-",
            f"{s['qnn_before']} -> {s['qnn_after']}",
        ]
    else:
        cells += [
            f"{o['seconds']:.3f}",
            f"{s['seconds'] / o['seconds']:.1f}x",
            f"{1000 * s['seconds'] / per:.0f}",
            f"{1000 * o['seconds'] / per:.1f}",
            f"{_mib(s['peak_kib']):.0f}",
            f"{_mib(o['peak_kib']):.0f}",
            f"{o['peak_kib'] / s['peak_kib']:.2f}",
            f"{_mib(s['delta_kib']):.1f}",
            f"{_mib(o['delta_kib']):.1f}",
            f"{s['qnn_before']} -> {s['qnn_after']} / {o['qnn_after']}",
        ]
    cells.append("-" if equal is None else "EQUAL" if equal else "DIFFERENT")
    return "| " + " | ".join(cells) + " |"


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "--blocks",
        type=int,
        nargs="+",
        default=list(DEFAULT_BLOCKS),
        help="numbers of QNN blocks for the synthetic models (default: 25 50 100 200)",
    )
    p.add_argument("--repeat", type=int, default=1, help="take the min over k runs (default 1)")
    p.add_argument("--quick", action="store_true", help="blocks 25 and 50 only")
    p.add_argument(
        "--regimes", nargs="+", default=["same", "distinct"], choices=["same", "distinct"]
    )
    p.add_argument("--no-cnn", action="store_true", help="skip the 4-layer qnn.conv2d CNN")
    p.add_argument(
        "--no-onnx",
        action="store_true",
        help="skip the QDQ ONNX models after FakeQuantizationToInteger (CNN, residual CNN, transformer block)",
    )
    p.add_argument(
        "--no-zoo",
        action="store_true",
        help="skip the float relay.testing models (resnet18, mobilenet; weights bound as constants)",
    )
    p.add_argument(
        "--policy",
        default="fold-qnn",
        choices=sorted(STOCK_FOR_POLICY),
        help="fold_guard policy; compared with FoldConstant(fold_qnn=True) for fold-qnn "
        "(the default), with FoldConstant() for default",
    )
    p.add_argument(
        "--steps",
        action="store_true",
        help="also print fold_guard's per-step seconds and evaluation runs",
    )
    # hidden worker flags
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", default="synthetic", help=argparse.SUPPRESS)
    p.add_argument("--regime", default="same", help=argparse.SUPPRESS)
    p.add_argument("--n", dest="n", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--impl", choices=IMPLS, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker:
        args.blocks = args.n
        return worker(args)

    impls: Tuple[str, ...] = IMPLS
    error = _adapter_import_error()
    if error is not None:
        impls = ("stock",)
        print(
            f"NOTE: fold_guard.relay does not import ({error}); timing the stock pass only, "
            "no comparison.",
            file=sys.stderr,
            flush=True,
        )

    blocks = list(QUICK_BLOCKS) if args.quick else args.blocks
    cases = [("synthetic", regime, n) for regime in args.regimes for n in blocks]
    if not args.no_cnn:
        cases.append(("qnn_cnn", "cnn", 0))
    if not args.no_onnx:
        cases += [(f"fq2i_{name}", "fq2i", 0) for name in ONNX_MODELS]
    if not args.no_zoo:
        cases += [(name, "float", 0) for name in ZOO_MODELS]

    rows = []
    any_diff = False
    with tempfile.TemporaryDirectory(prefix="fold_guard_bench_relay_") as tmpdir:
        for model, regime, n in cases:
            print(f"... {model} {regime} {n or '-'}", file=sys.stderr, flush=True)
            best, equal = measure(model, regime, n, impls, args.repeat, tmpdir, args.policy)
            any_diff |= equal is False
            rows.append((model, regime, n, best, equal))

    stock_name = "FoldConstant(fold_qnn=True)" if args.policy == "fold-qnn" else "FoldConstant()"
    print()
    print(
        f"stock = relay.transform.{stock_name}; ours = fold_guard.relay.fold(mod, policy={args.policy!r})"
    )
    print(
        "| model | regime | blocks | stock s | ours s | speedup | stock ms/block | ours ms/block "
        "| stock peak MiB | ours peak MiB | mem ratio | stock Δ MiB | ours Δ MiB | qnn calls | equal? |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for model, regime, n, best, equal in rows:
        print(format_row(model, regime, n, best["stock"], best.get("ours"), equal))
    if args.steps and "ours" in impls:
        steps = sorted(
            {k for *_, best, _ in rows for k in best["ours"].get("steps", {})},
            key=lambda k: (STEP_ORDER.index(k) if k in STEP_ORDER else len(STEP_ORDER), k),
        )
        print()
        print("| model | regime | blocks | folded | evaluation runs | " + " | ".join(steps) + " |")
        print("|---|---|---:|---:|---:|" + "---:|" * len(steps))
        for model, regime, n, best, _ in rows:
            o = best["ours"]
            st = o.get("steps", {})
            print(
                f"| {model} | {regime} | {n or '-'} | {o.get('folded', '?')} "
                f"| {o.get('evaluation_runs') if o.get('evaluation_runs') is not None else '?'} | "
                + " | ".join(f"{st[k]:.3f}" if k in st else "-" for k in steps)
                + " |"
            )
    print()
    print(
        f"speedup = stock s / ours s (wall time of the pass only, min over --repeat runs; stock is "
        f"{stock_name}); ms/block per synthetic block or per CNN layer; peak = VmHWM of the "
        "worker process; Δ = peak minus RSS just before the pass; mem ratio = ours peak / stock peak; "
        "qnn calls = qnn.* calls in main before -> after stock / after ours"
    )
    print("command: " + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]))
    if any_diff:
        print(f"ERROR: fold_guard output differs from stock {stock_name}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
