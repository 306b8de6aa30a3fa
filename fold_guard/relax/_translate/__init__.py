"""Translation: a Relax module read into the core's graph, behind one door (:func:`analyse`).

Step 1 of the fold (``_pass``), in four parts; what comes out (:class:`Analysis`) is all the
stages after it read:

0. preconditions (:func:`check_relax_module`: an IRModule of Relax functions; under ``strict`` a
   well-formed one) and the policy resolved;
1. what the stock pass normalizes in passing (:mod:`.normalize`), then every call binding
   checked and described (:mod:`.walk`, its operands by :mod:`.leaves`, stock's per-call rules
   asked once per call);
2. the calls that could fold legalized once per op signature (:mod:`.legalize` over
   :mod:`.requests`; :mod:`.shape_generic` says which ops one symbolic kernel may serve), the
   calls on run-time values probed first for operands their kernel only reads the type of
   (:mod:`.reads`), and the calls whose stock decision waits for a scalar folded in this same
   pass noted (:mod:`.pending`; :meth:`Analysis.stock_failures` decides them once it is
   evaluated);
3. every graph node built once, with what legalization found, and the nodes whose values must
   be kept (:attr:`Analysis.kept`); a backend table's rules settled on the module.

Nothing here imports the engine, the rewrite or the coordinator (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Mapping, Optional, Sequence, Tuple

import tvm
from tvm import relax

from ..._core.errors import PreconditionError
from ..._core.graph import FoldGraph, InputKind
from ..._core.offload import bind_tables
from ..._core.planner import FoldPlan
from ..._core.policy import FoldPolicy
from ..._core.registry import PolicySpec, resolve_policy
from ..._core.report import StepTimer
from ..._tvm.adapter import check_module
from .._sites import KernelSpec, Translation
from .legalize import legalize_candidates
from .normalize import hoist_match_cast_values
from .pending import stock_legalization_error
from .reads import probe_sites, probe_unread
from .walk import walk_relax

__all__ = ["Analysis", "analyse", "check_relax_module"]


def check_relax_module(mod: object) -> None:
    """Refuse anything but an IRModule of Relax functions, PrimFuncs and externs."""
    check_module(
        mod,
        "fold_guard.relax",
        (relax.Function, tvm.tirx.PrimFunc, relax.ExternFunc),
        not_module_hint="wrap a Relax function with tvm.IRModule({'main': func})",
        other_ir_hint=" (a Relay module? this release folds Relax only)",
        importers=IMPORTERS,
    )


#: The frontend call that makes a module of a model passed as it is, by the model's type.
IMPORTERS = {
    "onnx.ModelProto": "tvm.relax.frontend.onnx.from_onnx(model, keep_params_in_input=False)",
    "torch.ExportedProgram": "tvm.relax.frontend.torch.from_exported_program(program, "
    "custom_convert_map=fold_guard.relax.frontends.torch_quantized_convert_map())",
}


@dataclass(frozen=True)
class Analysis:
    """The module read for folding: its translation, the graph the planner decides on, the policy.

    ``mod`` is the module as read: the input, normalized as the stock pass would
    (:mod:`.normalize`); the rewrite starts from it. ``kernels`` are the legalized kernels of the
    calls that could fold.
    """

    mod: tvm.IRModule
    translation: Translation
    graph: FoldGraph
    policy: FoldPolicy
    kernels: Mapping[int, KernelSpec]
    #: the nodes whose values must outlive their consumers: what the rewrite may read whatever
    #: they do (``Translation.escaping``), and the scalars a stock decision is judged on once
    #: they are evaluated (:meth:`stock_failures`; 0-d: no memory)
    kept: FrozenSet[int] = frozenset()
    #: calls whose stock decision waits for the value of a scalar folded in the same pass
    pending_scalars: Mapping[int, Tuple[int, ...]] = field(default_factory=dict)

    def stock_failures(
        self, plan: FoldPlan, values: Mapping[int, Sequence[object]]
    ) -> Dict[int, str]:
        """The folded calls of ``plan`` the stock pass would not fold, judged on the values of the
        scalars folded in this same pass (:mod:`.pending`): where stock's legalization rejects the
        value, the call is kept with stock's reason, as an evaluation that failed.

        Judged wherever those values are known, whether or not the call itself was evaluated (an
        engine that legalizes on the values, as stock does, fails such a call with the
        legalizer's error; stock's reason takes its place).
        """
        found: Dict[int, str] = {}
        nodes = plan.graph.nodes
        for decision in plan.folded:
            leaves = self.pending_scalars.get(decision.node)
            if not leaves:
                continue
            inputs = nodes[decision.node].inputs
            scalars = {
                leaf: values[inputs[leaf].source][0].numpy()  # type: ignore[attr-defined]
                for leaf in leaves
                if inputs[leaf].kind is InputKind.NODE and inputs[leaf].source in values
            }
            if len(scalars) != len(leaves):
                continue
            why = stock_legalization_error(self.translation.sites[decision.node], scalars)
            if why is not None:
                found[decision.node] = why
        return found


def analyse(
    mod: tvm.IRModule,
    policy_spec: PolicySpec,
    timer: Optional[StepTimer] = None,
    *,
    strict: bool = False,
) -> Analysis:
    """Read ``mod`` for folding under ``policy_spec`` (parts 0-3 above); ``mod`` is not changed.

    ``timer`` gets a lap per step (``walk``, ``legalize``).
    """
    timer = timer or StepTimer()
    # Part 0. Preconditions, before any work: the module's kind (the TVM release was checked when
    # fold_guard.relax was imported), the policy, and under ``strict`` a well-formed input.
    check_relax_module(mod)
    policy = resolve_policy(policy_spec)
    if strict and not relax.analysis.check_well_formed(mod):
        # checked up front so the post-condition in ``fold`` can only ever blame fold_guard
        raise PreconditionError(
            "the input module is not well formed (strict mode checks fold_guard's output with "
            "relax.analysis.well_formed, so it needs a well-formed input); "
            "hint: run relax.analysis.well_formed(mod) to see the violation, or pass strict=False"
        )
    # Part 1. Normalize what the stock pass normalizes in passing, then describe every call
    # binding of every Relax function.
    mod = hoist_match_cast_values(mod)
    walk = walk_relax(mod)
    timer.lap("walk")
    # Part 2. Legalize once per op signature: which calls have a kernel, which stock would fold.
    # The calls not reachable from constants are probed first: a kernel that reads only an
    # operand's static type makes a call on a run-time value a candidate too (``reads``).
    candidates = walk.candidates()
    probes = probe_sites(walk, candidates)
    unread = probe_unread(probes)
    legalized = legalize_candidates(
        mod, walk.sites, walk.candidates(unread) if unread else candidates
    )
    timer.lap("legalize")
    # Part 3. Build the graph's nodes, each once, with what legalization found.
    translation = walk.translate(legalized.facts)
    graph = FoldGraph(translation.nodes)
    nodes = graph.nodes
    # kept too: the scalars a pending stock decision reads (``stock_failures``), until it has
    kept = translation.escaping | frozenset(
        nodes[node].inputs[leaf].source
        for node, leaves in legalized.pending_scalars.items()
        for leaf in leaves
        if nodes[node].inputs[leaf].kind is InputKind.NODE
    )
    analysis = Analysis(
        mod, translation, graph, policy, legalized.kernels, kept, legalized.pending_scalars
    )
    # A backend table's rules are settled on this module (fold_guard._core.offload).
    return dataclasses.replace(analysis, policy=bind_tables(policy, analysis))
