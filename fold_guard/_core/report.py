"""What one run of a fold_guard pass did: the plan, the bytes of constants, the time spent."""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Generic, Mapping, Optional, Tuple, Union

from .graph import ModuleT
from .planner import FoldPlan
from .summary import Summary, format_summary, summarize

__all__ = ["ConstantBytes", "FoldReport", "FoldResult", "StepTimer", "fold_result"]

#: Bytes of tensor constants before and after a pass, or the function that counts them when
#: first asked (a pass inside a build pipeline is never asked).
ConstantBytes = Union[Tuple[int, int], Callable[[], Tuple[int, int]]]

logger = logging.getLogger("fold_guard")


@dataclass(frozen=True)
class FoldReport:
    """The plan that was applied plus measurements of applying it.

    ``constant_bytes_before`` / ``constant_bytes_after`` are the bytes of all tensor constants in
    the module's functions before and after the pass, counted when first read: ``constant_bytes``
    is the pair or the function that counts it, because counting visits every constant of both
    modules (a noticeable part of a warm fold) and a pass run inside a pipeline never
    reads them; until they are read the report keeps both modules alive.

    ``seconds`` maps each step (for Relax: walk, legalize, plan, compile, evaluate, rewrite) to
    its wall time; ``kernels_compiled`` counts the distinct kernels built for the single batched
    evaluation and ``kernels_cached`` those loaded from the persistent kernel cache instead
    (Relax); ``evaluation_runs`` counts the interpreter runs that evaluated the folded calls
    (Relay, whose TE compiler does not report its kernels). ``fallbacks`` has a line for each
    fault of a speed mechanism the fold recovered from (Relax: the call was rerun on the
    reference engine, with the reference's bits; or the kernel cache failed and kernels were
    built without it); empty when nothing went wrong.
    """

    plan: FoldPlan
    constant_bytes: ConstantBytes = field(default=(0, 0), repr=False, compare=False)
    kernels_compiled: int = 0
    kernels_cached: int = 0
    seconds: Mapping[str, float] = field(default_factory=dict)
    evaluation_runs: int = 0
    fallbacks: Tuple[str, ...] = ()

    @functools.cached_property
    def _counted_bytes(self) -> Tuple[int, int]:
        # cached_property writes the instance's __dict__ directly, so it works on a frozen class
        counted = self.constant_bytes
        return counted() if callable(counted) else counted

    @property
    def constant_bytes_before(self) -> int:
        return self._counted_bytes[0]

    @property
    def constant_bytes_after(self) -> int:
        return self._counted_bytes[1]

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def explain(self, *, verbose: bool = True) -> str:
        """The plan's explanation followed by bytes, kernels and timings."""
        steps = ", ".join(f"{name} {secs * 1000:.0f} ms" for name, secs in self.seconds.items())
        return "\n".join(
            [
                self.plan.explain(verbose=verbose),
                f"constants: {self.constant_bytes_before} bytes before, "
                f"{self.constant_bytes_after} bytes after",
                f"{self._work()}; time: {self.total_seconds * 1000:.0f} ms ({steps})",
            ]
        )

    def to_dict(self, *, layers: Optional[Mapping[Tuple[str, str], str]] = None) -> Summary:
        """The report as the versioned dictionary of :func:`fold_guard._core.summary.summarize`."""
        before_after = (self.constant_bytes_before, self.constant_bytes_after)
        return summarize(
            self.plan, layers=layers, constant_bytes=before_after, seconds=self.seconds
        )

    def summary(
        self, *, layers: Optional[Mapping[Tuple[str, str], str]] = None, verbose: bool = False
    ) -> str:
        """Grouped text with bytes and times (:meth:`FoldPlan.summary` plus measurements)."""
        return format_summary(self.plan, self.to_dict(layers=layers), verbose=verbose)

    def _work(self) -> str:
        if self.evaluation_runs and not self.kernels_compiled:
            return f"evaluation runs: {self.evaluation_runs}"
        cached = (
            f", {self.kernels_cached} loaded from the kernel cache" if self.kernels_cached else ""
        )
        fallbacks = (
            f", {len(self.fallbacks)} fallback{'s' if len(self.fallbacks) != 1 else ''} "
            f"({'; '.join(self.fallbacks)})"
            if self.fallbacks
            else ""
        )
        return f"kernels compiled: {self.kernels_compiled}{cached}{fallbacks}"


@dataclass(frozen=True)
class FoldResult(Generic[ModuleT]):
    """What an adapter's ``fold`` returns: the new module, whether it differs, the plan and the report.

    ``mod`` is the adapter's IR module (a ``tvm.IRModule``); the input module is never changed.
    """

    mod: ModuleT
    modified: bool
    plan: FoldPlan
    report: FoldReport


def fold_result(
    new_mod: ModuleT,
    plan: FoldPlan,
    *,
    modified: bool,
    implementation: str,
    timer: StepTimer,
    constant_bytes: ConstantBytes,
    kernels_compiled: int = 0,
    kernels_cached: int = 0,
    evaluation_runs: int = 0,
    fallbacks: Tuple[str, ...] = (),
) -> FoldResult[ModuleT]:
    """An adapter's ``fold`` result: the report of ``plan`` and its measurements, logged at INFO.

    The log line is ``<implementation>: <report>``; the report's text is built only when a
    handler listens at INFO (it walks every decision).
    """
    report = FoldReport(
        plan,
        constant_bytes=constant_bytes,
        kernels_compiled=kernels_compiled,
        kernels_cached=kernels_cached,
        seconds=dict(timer.seconds),
        evaluation_runs=evaluation_runs,
        fallbacks=fallbacks,
    )
    if logger.isEnabledFor(logging.INFO):
        logger.info("%s: %s", implementation, report.explain(verbose=False))
    return FoldResult(new_mod, modified, plan, report)


class StepTimer:
    """Wall time per named step, accumulated: ``lap(step)`` charges the time since the last lap.

    >>> timer = StepTimer()
    >>> timer.lap("plan")
    >>> sorted(timer.seconds)
    ['plan']
    """

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}
        self._start = time.perf_counter()

    def lap(self, step: str) -> None:
        now = time.perf_counter()
        self.seconds[step] = self.seconds.get(step, 0.0) + now - self._start
        self._start = now
