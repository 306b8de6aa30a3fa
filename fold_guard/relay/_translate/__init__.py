"""Translation: a Relay module read into the core's graph, behind one door (:func:`analyse`).

The module is checked, a detached copy of it typed (``_module``), and the functions to fold
walked (:mod:`.walk`: every op call described as stock folding sees it, stock's per-call rules
asked once per call; :mod:`.zero_size`: kernels that would read memory nobody wrote). What comes
out (:class:`Analysis`) is all the stages after it read. An ``If`` whose condition folds is its
branch from then on, as in stock folding: the coordinator walks again with the condition known
(:meth:`Analysis.walk_again`).

Nothing here imports the engine, the rewrite or the coordinator (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence, Tuple

import tvm
from tvm import relay

from ..._core.graph import FoldGraph
from ..._core.offload import bind_tables
from ..._core.policy import FoldPolicy
from ..._core.registry import PolicySpec, resolve_policy
from ..._core.report import StepTimer
from .._module import check_relay_module, detached_copy, infer_types
from .._read import foldable_functions
from .._sites import Translation
from .walk import walk_relay

__all__ = ["Analysis", "analyse"]


@dataclass(frozen=True)
class Analysis:
    """The module read for folding: its translation (the walk), the graph the planner decides on, the policy.

    ``mod`` is the typed copy of the input (Relay types a detached copy, see ``_module.detached_copy``);
    ``selected`` (Relay only) are the functions chosen to fold, which a second walk reads again.
    """

    mod: tvm.IRModule
    translation: Translation
    graph: FoldGraph
    policy: FoldPolicy
    selected: Sequence[Tuple[str, relay.Function]]

    def walk_again(self, known_conditions: Mapping[relay.If, bool]) -> Translation:
        """The selected functions walked again, each ``If`` of ``known_conditions`` read as the
        branch its folded condition picks."""
        return walk_relay(self.mod, self.selected, known_conditions)


def analyse(
    mod: tvm.IRModule,
    policy_spec: PolicySpec,
    timer: Optional[StepTimer] = None,
    *,
    functions: Optional[Iterable[str]] = None,
) -> Analysis:
    """Check and type a copy of ``mod``, then walk the functions to fold (``functions``: by name,
    else every function the stock pass folds); ``mod`` is not changed."""
    timer = timer or StepTimer()
    policy = resolve_policy(policy_spec)
    typed = infer_types(detached_copy(check_relay_module(mod)), "the input module", visible=False)
    # Describe every op call of the functions to fold, as stock folding sees it.
    selected = foldable_functions(typed, functions)
    translation = walk_relay(typed, selected)
    timer.lap("walk")
    analysis = Analysis(typed, translation, FoldGraph(translation.nodes), policy, selected)
    # A backend table's rules are settled on this module (fold_guard._core.offload).
    return dataclasses.replace(analysis, policy=bind_tables(policy, analysis))
