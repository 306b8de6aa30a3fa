"""Measure how far TVM's output of the example QDQ models lies from onnxruntime's.

The tolerances of ``examples/_common/onnx_models.py`` (``TOLERANCE_STEPS`` and
``INTEGER_TOLERANCE_STEPS``) are the largest differences this script prints plus one step. Run
it in each environment: the Relax import needs TVM 0.27 (``.venv``), the Relay import and the
module after ``FakeQuantizationToInteger`` need a TVM with Relay (``.venv310``)::

    .venv/bin/python scripts/measure_tolerance.py       # about 1 minute on 2 cores
    .venv310/bin/python scripts/measure_tolerance.py    # about 4-5 minutes

For every model (seeds 0, 1 and 2 unless ``--seeds``; uint8 and int8 activations) and every
pipeline this TVM has, it runs ``--inputs`` random inputs (standard normal times a scale drawn
from 0.5..3) and prints, per onnxruntime setting, the largest difference in output quantization
steps and in how many inputs the outputs differed at all. ``unfused`` is the reference semantics
of a QDQ model (float operators between real Q/DQ pairs, session option
``session.disable_quant_qdq``); ``fused`` is onnxruntime's default, whose integer kernels depend
on the CPU (see ``run_onnxruntime``). ``--json`` prints only the largest differences.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, Dict, Iterator, List, Tuple

import numpy as np

# examples/_common: the QDQ ONNX models the examples, the benchmarks and the tests share.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

from _common import onnx_models

Runner = Callable[[Dict[str, np.ndarray]], np.ndarray]


def _relax_pipelines(model) -> Iterator[Tuple[str, Runner]]:
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(
        tvm.compile(onnx_models.import_relax(model), target="llvm"), tvm.cpu()
    )
    yield (
        "relax import",
        lambda feed: vm["main"](*[tvm.runtime.tensor(x) for x in feed.values()]).numpy(),
    )


def _relay_pipelines(model) -> Iterator[Tuple[str, Runner]]:
    from tvm import relay

    imported = onnx_models.import_relay(model)
    fq2i = relay.transform.InferType()(relay.transform.FakeQuantizationToInteger()(imported))
    for name, mod in (("relay import", imported), ("relay fq2i", fq2i)):
        run = onnx_models.build_relay(mod)
        yield name, lambda feed, run=run: run(feed)[0]


def _feeds(model, count: int) -> List[Dict[str, np.ndarray]]:
    rng = np.random.default_rng(1234)
    feeds = []
    for seed in range(count):
        scale = np.float32(rng.uniform(0.5, 3.0))
        feeds.append({k: v * scale for k, v in onnx_models.input_feed(model, seed).items()})
    return feeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=100, help="inputs per model (100)")
    parser.add_argument(
        "--models",
        nargs="+",
        choices=sorted(onnx_models.MODEL_BUILDERS),
        default=list(onnx_models.MODEL_BUILDERS),
        help="models to measure (all)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print only the largest differences, as JSON records (for tests)",
    )
    parser.add_argument(
        "--seeds", nargs="+", type=int, default=[0, 1, 2], help="model seeds (0 1 2)"
    )
    args = parser.parse_args()
    try:
        import tvm.relay  # noqa: F401

        pipelines = _relay_pipelines
    except ImportError:
        pipelines = _relax_pipelines
    worst: Dict[Tuple[str, str, str], int] = {}
    for builder_name in args.models:
        builder = onnx_models.MODEL_BUILDERS[builder_name]
        for activation_type in ("uint8", "int8"):
            for seed in args.seeds:
                model = builder(seed, activation_type=activation_type)
                step = onnx_models.output_scale(model)
                feeds = _feeds(model, args.inputs)
                references = {
                    setting: [
                        onnx_models.run_onnxruntime(model, f, fuse_qdq=fuse)[0] for f in feeds
                    ]
                    for setting, fuse in (("unfused", False), ("fused", True))
                }
                for pipeline, run in pipelines(model):
                    outputs = [run(f) for f in feeds]
                    for setting, expected in references.items():
                        steps = [
                            int(np.rint(np.abs(a - e).max() / step))
                            for a, e in zip(outputs, expected)
                        ]
                        differing = sum(1 for s in steps if s)
                        key = (builder_name, pipeline, setting)
                        worst[key] = max(worst.get(key, 0), max(steps))
                        if args.json:
                            continue
                        print(
                            f"{builder_name:17} {activation_type:5} seed {seed}  {pipeline:12} "
                            f"vs {setting:7}: max {max(steps)} steps, "
                            f"{differing}/{len(steps)} inputs differ",
                            flush=True,
                        )
    if args.json:
        records = [
            {"model": model, "pipeline": pipeline, "reference": setting, "steps": steps}
            for (model, pipeline, setting), steps in sorted(worst.items())
        ]
        print(json.dumps(records, indent=1))
        return
    print("\nlargest difference in output steps, over all seeds and activation types:")
    for (builder_name, pipeline, setting), steps in sorted(worst.items()):
        print(f"  {builder_name:17} {pipeline:12} vs {setting:7}: {steps}")


if __name__ == "__main__":
    main()
