"""What both adapters' ``partition`` share: running a backend's partitioner with nothing folding.

A module annotated for a backend carries its weights as ``dequantize(fold_barrier(<int8 const>))``
(Relax) or ``qnn.dequantize(fold_barrier(<int8 const>))`` (Relay). Unmodified pattern tables are
written for ``dequantize(is_const())``, so the barriers must go right before partitioning; and once
they are gone any ``FoldConstant`` would turn the int8 weight back into fp32. Partition functions
often run one themselves (Relax CLML's ``OpenCLMLOffLoad``, Relay's ``partition_for_ethosn`` with
``fold_qnn=True``). So the partitioner runs under a pass instrument that skips every pass
registered as ``FoldConstant`` (stock or fold_guard's) and records each skip, and afterwards every
released constant must still be in the module with its own dtype: a partition function that
folds in a ``PassContext`` of its own (the instrument does not reach there) is caught by that
check instead of silently returning fp32 weights.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Generic, Hashable, Iterator, List, Sequence, Set, Tuple, TypeVar

import tvm

from .._core.errors import PreconditionError
from .pass_context import PASS_NAME

__all__ = [
    "FOLDING_PASSES",
    "ConstantsView",
    "Partitioned",
    "folding_skipped",
    "partition_released",
]

#: Passes that evaluate constants: skipped between releasing the barriers and the partition.
FOLDING_PASSES = (PASS_NAME,)

ModuleT = TypeVar("ModuleT")
ExprT = TypeVar("ExprT")


@dataclass(frozen=True)
class Partitioned(Generic[ModuleT]):
    """What ``partition`` returns: the partitioned module, what was released, what was skipped.

    ``released`` is the number of ``fold_barrier`` calls removed before the partition function
    ran, ``released_constants`` how many of them stood on a constant (a weight the partitioner
    now sees as a plain constant). ``skipped`` names each folding pass the partition function
    tried to run, in order; each was skipped because it would have folded a released weight.
    """

    mod: ModuleT
    released: int
    released_constants: int
    skipped: Tuple[str, ...]

    def explain(self) -> str:
        """One line: what was released and which folding passes were skipped."""
        skipped = ", ".join(self.skipped) if self.skipped else "none"
        return (
            f"released {self.released} fold_barrier ({self.released_constants} on constants); "
            f"folding passes skipped inside the partition function: {skipped}"
        )


@tvm.instrument.pass_instrument
class _SkipFolding:
    """Skips every pass named in :data:`FOLDING_PASSES` and records it."""

    def __init__(self) -> None:
        self.skipped: List[str] = []

    def should_run(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> bool:
        if str(info.name) in FOLDING_PASSES:
            self.skipped.append(str(info.name))
            return False
        return True


@contextlib.contextmanager
def folding_skipped() -> Iterator[List[str]]:
    """Enter a PassContext like the caller's (opt level, config, pass lists, instruments) that
    also skips every folding pass; yields the list the skipped pass names are appended to."""
    current = tvm.transform.PassContext.current()
    skip = _SkipFolding()
    with tvm.transform.PassContext(
        opt_level=current.opt_level,
        required_pass=list(current.required_pass),
        disabled_pass=list(current.disabled_pass),
        instruments=[*current.instruments, skip],
        config={str(key): value for key, value in current.config.items()},
    ):
        yield skip.skipped


@dataclass(frozen=True)
class ConstantsView(Generic[ModuleT, ExprT]):
    """How an adapter's constants are told apart: what ``partition`` checks after the partitioner.

    ``is_constant`` picks the released operands that are constants; ``key`` identifies a
    constant's array (the same for every node holding it: a partitioner may copy the node into
    a composite); ``keys_in`` gives the keys of every constant in a module's functions;
    ``describe`` says what a constant is (``int8[4, 4]``).
    """

    is_constant: Callable[[ExprT], bool]
    key: Callable[[ExprT], Hashable]
    keys_in: Callable[[ModuleT], Set[Hashable]]
    describe: Callable[[ExprT], str]


def partition_released(
    released: ModuleT,
    operands: Sequence[ExprT],
    partition_fn: Callable[[ModuleT], ModuleT],
    constants: ConstantsView[ModuleT, ExprT],
) -> Partitioned[ModuleT]:
    """Run ``partition_fn`` on ``released`` (the module with its barriers removed, ``operands``
    their operands) with every folding pass skipped, then check that no released constant was
    folded away.

    Raises :class:`~fold_guard.PreconditionError` when one is missing from the result: the
    partition function folded it, in a ``PassContext`` of its own the skip does not reach.
    """
    kept = [operand for operand in operands if constants.is_constant(operand)]
    with folding_skipped() as skipped:
        result = partition_fn(released)
    if kept:
        present = constants.keys_in(result)
        missing = [c for c in kept if constants.key(c) not in present]
        if missing:
            raise PreconditionError(
                f"partition: {len(missing)} of {len(kept)} released constants are gone from "
                f"the partitioned module (the first: {constants.describe(missing[0])}); the "
                "partition function folded them, probably in a PassContext of its own, where "
                "fold_guard cannot skip its FoldConstant; hint: run its folding steps before "
                "annotate's barriers are released, and pass partition only its partitioning steps"
            )
    return Partitioned(result, len(operands), len(kept), tuple(skipped))
