"""Running one dependency level of folded calls: the large ones on a thread pool, values released.

The calls of one level read only values of earlier levels, so they are independent: the large
ones run on a pool of threads (a compiled kernel and NumPy's copies release the GIL), while the
calling thread runs the small ones. Where a call runs changes none of its bits: every call writes
its own output tensors (a row block its own rows of them), and its kernel is the one it would run
alone. Everything that touches shared state (choosing a kernel, checking a guard, building an
``-O3`` kernel on demand, recording values, failures and fallbacks) stays on the calling thread.

As each call finishes, the values nothing needs any more are dropped (:func:`drop_unneeded`,
given ``releasable``: every consumer folded and evaluated, no use outside the graph), and a call
allocates its outputs only when it starts, so a model's intermediate constants (the int8 weights
between ``quantize`` and ``dequantize``) do not all stay alive to the end.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import AbstractSet, Callable, Dict, List, Mapping, Optional, Sequence, Union

from ..._core.graph import FoldNode, InputKind
from .interface import Values

__all__ = ["PARALLEL_MIN_BYTES", "Call", "Outcome", "Pool", "drop_unneeded", "run_level", "spent"]

#: A call whose outputs are smaller than this runs on the calling thread: handing it to another
#: thread would cost more than it saves.
PARALLEL_MIN_BYTES = 1 << 18


#: A part of a call's computation; each returns the call's output tensors.
Run = Callable[[], List[object]]


@dataclass(eq=False)
class Call:
    """One folded call, ready to run.

    ``start`` allocates its outputs, on the calling thread (allocations on pool threads land in
    per-thread malloc arenas, which hold on to freed memory), and
    returns the computation in ``parts`` parts, which any threads may run at once.
    """

    node: FoldNode
    start: Callable[[], Sequence[Run]]
    nbytes: int = 0
    parts: int = 1


class Pool:
    """A thread pool for one fold; with ``warm_up``, its threads all start with its first task.

    ``ThreadPoolExecutor`` starts a thread for a task only if it counts no idle one, and it
    counts one per task ended, not per thread waiting: after a level of many calls it may count
    idle threads that are busy, and leave the row blocks of the next level's one large call to a
    single thread. With ``warm_up`` the first task is preceded by one per thread that waits for
    all of them to arrive. A fold with no large call starts no thread.
    """

    def __init__(self, threads: int, *, warm_up: bool = True):
        self._threads = threads
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="fold_guard")
        self._started = not warm_up

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self._executor.shutdown(wait=True)

    def submit(self, task: Callable[[], List[object]]) -> Future:
        if not self._started:
            self._started = True
            arrived = threading.Barrier(self._threads)

            def arrive() -> None:
                try:
                    arrived.wait(timeout=10)
                except threading.BrokenBarrierError:  # a thread that never started
                    pass

            for _ in range(self._threads):
                self._executor.submit(arrive)
        return self._executor.submit(task)


def spent() -> Sequence[Run]:
    raise AssertionError("a folded call ran twice")


def drop_unneeded(
    node: FoldNode,
    release: Mapping[int, Sequence[int]],
    evaluated: AbstractSet[int],
    values: Values,
) -> None:
    """Drop the values of ``node`` (just evaluated) and its operands that nothing needs any more."""
    candidates = [inp.source for inp in node.inputs if inp.kind is InputKind.NODE]
    for node_id in (*candidates, node.id):
        consumers = release.get(node_id)
        if consumers is not None and all(consumer in evaluated for consumer in consumers):
            values.pop(node_id, None)


Outcome = Union[List[object], Exception]


def run_level(
    calls: Sequence[Call],
    executor: Optional[Pool],
    threads: int,
    finished: Callable[[Call, Outcome], None],
) -> None:
    """Run ``calls``, the large ones on ``executor``; ``finished`` sees each outcome on this thread.

    Large calls are started (their outputs allocated) while fewer than ``threads`` parts run,
    and each outcome is handed to ``finished`` as its call's last part ends: the operands a call
    was the last to read are dropped before the next call allocates, so the level's outputs
    replace its operands instead of coming on top of them.
    """
    large = [c for c in calls if c.nbytes >= PARALLEL_MIN_BYTES] if executor is not None else []
    if sum(c.parts for c in large) < 2:
        large = []
    waiting = deque(large)
    running: Dict[Future, Call] = {}
    parts_left: Dict[Call, int] = {}
    errors: Dict[Call, Exception] = {}

    def start_next() -> None:
        """Start the next waiting call that allocates (one that cannot is recorded as failed)."""
        assert executor is not None
        while waiting:
            call = waiting.popleft()
            try:
                parts = call.start()
            except Exception as err:  # noqa: BLE001 - handed to ``finished``: a fallback or a failure
                finished(call, err)
                continue
            parts_left[call] = len(parts)
            for part in parts:
                running[executor.submit(part)] = call
            return

    def fill() -> None:
        while waiting and len(running) < threads:
            start_next()

    def collect(block: bool) -> None:
        """Hand over the calls whose last part ended (with ``block``, wait for a part first)."""
        if block:
            done = list(wait(running, return_when=FIRST_COMPLETED)[0])
        else:
            done = [future for future in running if future.done()]
        for future in done:
            call = running.pop(future)
            error = future.exception()
            if isinstance(error, Exception):
                errors.setdefault(call, error)
            elif error is not None:
                future.result()  # KeyboardInterrupt and the like: raised here
            parts_left[call] -= 1
            if not parts_left[call]:
                del parts_left[call]
                finished(call, errors.pop(call) if call in errors else future.result())
        fill()

    fill()
    on_pool = set(large)
    for call in calls:
        if call not in on_pool:
            finished(call, _outcome(call))
            # a pool thread whose part ended gets the next one now, not after the small calls
            if running:
                collect(block=False)
    while running:
        collect(block=True)


def _outcome(call: Call) -> Outcome:
    """Run all of ``call`` on this thread."""
    try:
        outputs: List[object] = []
        for part in call.start():
            outputs = part()
        return outputs
    except Exception as err:  # noqa: BLE001 - handed to ``finished``: a fallback or a failure
        return err
