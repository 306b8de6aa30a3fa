"""A low-bit LLM decoder block (MLC-LLM's q4f16_1 weights), folded stock and with fold_guard.

``_common/lowbit_llm.py`` builds a Llama-style decoder layer (q / k / v / o and gate / up / down
projections) whose weights are generated and quantized as MLC-LLM's ``q4f16_1`` stores them:
int4 packed 8 to a ``uint32``, one float16 scale per group of 32, zero point 7. Each projection
is ``call_tir(dequantize, (<uint32 constant>, <float16 constant>)) -> permute_dims -> matmul``,
the weights bound as constants as ``BindParams`` or a baked model has them. The fusions that make
such a model fast (MLC-LLM's ``FuseDequantizeTranspose`` / ``FuseDequantizeMatmulEwise``) find
the kernel by its name and its packed integer operand, so this script counts, per projection,
whether a pattern ``call_tir(dequantize*, (<uint32 const>, <f16 const>)) -> permute_dims ->
matmul`` still matches (a ``FuseOpsByPattern`` table with that check: TVM's own
``cutlass.decode_matmul`` wants the decode straight into the matmul and an int8 weight, so it
never matches this layout). Stock ``FoldConstant`` evaluates every dequantize into a float16
constant; ``fold_guard.relax.fold(mod, policy="keep-qdq-weights")`` keeps them. Every module is
built and run on the CPU against the unfolded one.

The second part is TVM's CUTLASS-style flow with the weight as a parameter (``num_input``):
``encode`` -> ``decode`` -> ``matmul``, lifted with ``LiftTransformParams``; there TVM's
``cutlass.decode_matmul`` patterns run as they ship (no CUDA needed to match).

Run: python examples/lowbit_llm.py [--hidden 256 --intermediate 704 --heads 4 --tokens 4]
"""

from __future__ import annotations

import argparse
from typing import Dict, List, Tuple

import numpy as np
import tvm
from _common import lowbit_llm
from tvm import relax
from tvm.relax.dpl import GlobalVarPattern, TuplePattern, is_const, is_op, wildcard

import fold_guard.relax as fgr

PATTERN = "mlc.dequantize_matmul"


def _dequantize_matmul_table(matched: List[str]) -> List[relax.transform.FusionPattern]:
    """MLC-LLM's predicate as a pattern table: a ``dequantize*`` kernel of a packed uint32 constant
    and its scales, transposed, as a matmul's weight. Each match appends the name its matmul was
    bound to (``q_proj``, ...) to ``matched``."""
    packed, scale = is_const(), is_const()
    decode = is_op("relax.call_tir")(GlobalVarPattern(), TuplePattern([packed, scale]))
    root = is_op("relax.matmul")(wildcard(), is_op("relax.permute_dims")(decode))

    def check(ctx: relax.transform.PatternCheckContext) -> bool:
        call = ctx.annotated_expr["decode"]
        ok = str(call.args[0].name_hint).startswith("dequantize") and (
            str(ctx.annotated_expr["packed"].ty.dtype) == "uint32"
        )
        if ok:
            matched.append(str(ctx.value_to_bound_var[ctx.annotated_expr["root"]].name))
        return ok

    annotations = {"decode": decode, "packed": packed, "root": root}
    return [relax.transform.FusionPattern(PATTERN, root, annotations, check)]


def matched_projections(mod: tvm.IRModule) -> List[str]:
    """The projections whose ``<name>_proj`` matmul the table fuses, by name."""
    matched: List[str] = []
    relax.transform.FuseOpsByPattern(_dequantize_matmul_table(matched), annotate_codegen=False)(mod)
    return [name.removesuffix("_proj") for name in matched]


def _run(mod: tvm.IRModule, inputs: List[np.ndarray]) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()


def fold_block(args: argparse.Namespace) -> None:
    mod = lowbit_llm.build_decoder_block(
        hidden=args.hidden, intermediate=args.intermediate, heads=args.heads, tokens=args.tokens
    )
    names = lowbit_llm.projection_names()
    print(
        f"Llama-style decoder block, q4f16_1 weights (hidden {args.hidden}, intermediate "
        f"{args.intermediate}, {args.heads} heads, {args.tokens} tokens): {len(names)} projections"
    )
    result = fgr.fold(mod, policy="keep-qdq-weights")
    rows: List[Tuple[str, tvm.IRModule]] = [
        ("imported", mod),
        ("stock FoldConstant", relax.transform.FoldConstant()(mod)),
        ("fold_guard keep-qdq-weights", result.mod),
    ]
    inputs = lowbit_llm.block_inputs(mod)
    expected = _run(mod, inputs)
    matches: Dict[str, List[str]] = {}
    print(
        f"{'module':28s} {'constant bytes':>14s} {'dequantize(uint32 const)':>24s} "
        f"{'pattern matches':>15s}  output"
    )
    for label, module in rows:
        matches[label] = matched_projections(module)
        out = _run(module, inputs)
        same = "bit-identical to imported" if out.tobytes() == expected.tobytes() else "DIFFERENT"
        print(
            f"{label:28s} {lowbit_llm.constant_bytes(module):>14,d} "
            f"{len(lowbit_llm.dequantize_calls(module)):>24d} "
            f"{len(matches[label]):>9d} of {len(names)}  {same}"
        )
    print()
    print(f"{PATTERN} (call_tir(dequantize*, (<uint32>, <f16>)) -> permute_dims -> matmul):")
    print(f"{'projection':12s}" + "".join(f"{label:>30s}" for label, _ in rows))
    for name in names:
        cells = ("matches" if name in matches[label] else "-" for label, _ in rows)
        print(f"{name:12s}" + "".join(f"{cell:>30s}" for cell in cells))
    print()
    print("keep-qdq-weights, its report:")
    print(result.report.explain(verbose=False))


def lift_cutlass_style(bits: int) -> None:
    """TVM's CUTLASS-style flow: the decode stays in ``main`` only once annotated."""
    import tvm.relax.backend.cuda.cutlass  # registers the CUTLASS patterns
    from tvm.relax.backend.pattern_registry import get_patterns_with_prefix

    patterns = get_patterns_with_prefix("cutlass.decode_matmul")
    # TVM's own form: one encode kernel of two results (int8 weight, fp16 scales)
    mod = lowbit_llm.build_cutlass_style_module(k=64, n=96, bits=bits)
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (4, 64)).astype("float16")
    w = (rng.standard_normal((64, 96)) / 8).astype("float16")
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    expected = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    for label, module in (
        ("stock", mod),
        ("annotate(keep-qdq-weights)", fgr.annotate(mod, policy="keep-qdq-weights").mod),
    ):
        lifted = relax.transform.LiftTransformParams()(module)
        vm = relax.VirtualMachine(tvm.compile(lifted, target="llvm"), tvm.cpu())
        weights = vm["main_transform_params"]([tvm.runtime.tensor(w)])
        out = vm["main"](tvm.runtime.tensor(x), *weights).numpy()
        fused = fgr.partition(
            lifted, relax.transform.FuseOpsByPattern(patterns, annotate_codegen=False)
        ).mod
        composites = sorted(
            str(f.attrs["Composite"])
            for f in fused.functions.values()
            if isinstance(f, relax.Function) and f.attrs and "Composite" in f.attrs
        )
        kernels = [
            str(b.value.args[0].name_hint)
            for block in lifted["main"].body.blocks
            for b in block.bindings
            if isinstance(b.value, relax.Call) and b.value.op == tvm.ir.Op.get("relax.call_tir")
        ]
        same = "bit-identical" if out.tobytes() == expected.tobytes() else "DIFFERENT"
        print(
            f"  {label:28s} main gets {','.join(str(t.dtype) for t in weights):16s} "
            f"main's kernels: {','.join(kernels) or '-':8s} "
            f"cutlass: {','.join(composites) or '-':22s} {same}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=704)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=4)
    args = parser.parse_args()
    fold_block(args)
    print()
    print("TVM's CUTLASS-style flow, weight as a parameter: encode -> decode -> matmul, lifted")
    for bits in (8, 4):
        print(f" {bits}-bit weight:")
        lift_cutlass_style(bits)


if __name__ == "__main__":
    main()
