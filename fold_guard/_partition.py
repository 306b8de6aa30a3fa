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
from typing import Generic, Iterator, List, Tuple, TypeVar

import tvm

from ._pass_context import PASS_NAME

__all__ = ["FOLDING_PASSES", "Partitioned", "folding_skipped"]

#: Passes that evaluate constants: skipped between releasing the barriers and the partition.
FOLDING_PASSES = (PASS_NAME,)

ModuleT = TypeVar("ModuleT")


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
