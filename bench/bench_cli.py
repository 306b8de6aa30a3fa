"""How much the ``fold-guard`` command adds to the library's own work.

For each model, in one process with TVM already imported (best of ``--repeat``):

- ``library``: what any user of the library pays: read the file into a module
  (``fold_guard.cli._load.load_model``: ``from_onnx`` or ``tvm.ir.load_json``) and
  ``fold_guard.relax.fold(mod, policy=...)``;
- ``command``: what ``fold-guard inspect`` does besides that (argument parsing, policy checks,
  the report and its formatting), timed on its own, and its share of the two;
- ``total``: the whole command in-process (``fold_guard.cli.main``), for reference; on this noisy
  machine it is not a precise sum.

Models: the examples' QDQ CNN (``_common.onnx_models.make_qdq_cnn``, an ONNX file) and
a synthetic Relax module of ``--calls`` calls (blocks of ``dequantize(int8 const) -> matmul ->
add``, one foldable call in three, as in real CNNs where most calls are "not constant"), saved
with ``tvm.ir.save_json``. ``--json`` and ``--verbose`` runs show the cost of the full outputs.
The import of fold_guard and TVM (``python -c "import fold_guard"``, about 1-2 s) is printed
apart: it is the same for every command and not the command's overhead.

    .venv/bin/python bench/bench_cli.py [--calls 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable, List

import numpy as np

#: examples/_common: the QDQ ONNX models the examples, the benchmarks and the tests share.
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
)


def synthetic_module(calls: int):
    """``calls`` calls in blocks of three: ``w = dequantize(int8 const)``, ``matmul``, ``add``."""
    import tvm
    from tvm import relax

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for _ in range(calls // 3):
                weight = relax.const(rng.integers(-127, 128, (32, 32)).astype("int8"))
                w = bb.emit(
                    relax.op.dequantize(
                        weight, relax.const(0.01, "float32"), relax.const(0, "int8"), axis=0
                    )
                )
                y = bb.emit(relax.op.matmul(y, w))
                y = bb.emit(relax.op.add(y, relax.const(np.ones((1, 32), "float32"))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return tvm.ir.save_json(bb.get())


def best(repeat: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()

    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import fold_guard.cli, fold_guard.relax"], check=True)
    print(
        f"import of fold_guard + TVM in a fresh process: {time.perf_counter() - start:.2f} s (not counted below)"
    )

    import onnx
    from _common.onnx_models import make_qdq_cnn

    import fold_guard.relax as fgr
    from fold_guard.cli import main as command
    from fold_guard.cli._load import load_model

    with tempfile.TemporaryDirectory() as tmp:
        cnn = os.path.join(tmp, "qdq_cnn.onnx")
        onnx.save(make_qdq_cnn(), cnn)
        big = os.path.join(tmp, f"synthetic_{options.calls}.json")
        with open(big, "w") as handle:
            handle.write(synthetic_module(options.calls))
        rows: List[str] = []
        for path, policy, extra in [
            (cnn, "default", []),
            (cnn, "keep-qdq-weights", []),
            (big, "default", []),
            (big, "keep-qdq-weights", []),
            (big, "keep-qdq-weights", ["--json"]),
            (big, "keep-qdq-weights", ["--verbose"]),
        ]:
            model = load_model(path)
            result = fgr.fold(model.mod, policy=policy)
            # best() calls each lambda within this iteration, so late binding cannot bite.
            library = best(options.repeat, lambda: fgr.fold(load_model(path).mod, policy=policy))  # noqa: B023
            # The command's own work, timed by itself: two noisy totals on a shared machine make a
            # poor difference. This is everything cmd_inspect does beyond load_model and fold.
            own = best(options.repeat, lambda: render(model, result, policy, extra))  # noqa: B023
            argv = ["inspect", path, "-p", policy, *extra]
            status: List[int] = []
            cmd = best(options.repeat, lambda: status.append(command(argv, out=io.StringIO())))  # noqa: B023
            assert set(status) == {0}, status
            share = own / (library + own) * 100
            name = f"{os.path.basename(path)} {policy} {' '.join(extra)}".strip()
            rows.append(
                f"{name:<46} {len(result.plan.decisions):>6} {library:>9.3f} {own:>9.4f} {share:>7.1f}% {cmd:>9.3f}"
            )
    print(
        f"{'model, policy, options':<46} {'calls':>6} {'library':>9} {'command':>9} {'share':>8} {'total':>9}"
    )
    print("\n".join(rows))
    print(
        "library: load_model + fold (s); command: the command's own work (parse, policy check, report, "
        "format); share: command / (library + command); total: the whole command in-process (s)"
    )


def render(model, result, policy: str, extra: List[str]) -> str:
    """What cmd_inspect does besides loading and folding: arguments, policy check, the report."""
    from fold_guard._core.summary import format_summary
    from fold_guard.cli._commands import _report, policy_spec
    from fold_guard.cli._parser import build_parser

    args = build_parser().parse_args(["inspect", model.path, "-p", policy, *extra])
    policy_spec(args.policy)
    report = _report(model, result)
    if args.json:
        return json.dumps(report)
    return format_summary(result.plan, report, verbose=args.verbose)


if __name__ == "__main__":
    main()
