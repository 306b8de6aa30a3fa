"""How many threads fold_guard's parallel steps (kernel builds, a level's large calls) use."""

from __future__ import annotations

import os

from .._core.errors import PreconditionError

__all__ = ["THREADS_ENV", "usable_cpus"]

#: Caps the threads (``1``: everything on the calling thread); unset, the CPUs the process may use.
THREADS_ENV = "FOLD_GUARD_THREADS"


def usable_cpus() -> int:
    """``$FOLD_GUARD_THREADS`` if set, else the CPUs this process may run on (its affinity mask).

    >>> import os
    >>> os.environ["FOLD_GUARD_THREADS"] = "1"
    >>> usable_cpus()
    1
    >>> del os.environ["FOLD_GUARD_THREADS"]
    """
    raw = os.environ.get(THREADS_ENV, "").strip()
    if raw:
        try:
            count = int(raw)
        except ValueError:
            count = 0
        if count < 1:
            raise PreconditionError(
                f"{THREADS_ENV}={raw!r} is not a positive number of threads; hint: unset it to "
                f"use every CPU this process may run on, or set {THREADS_ENV}=1 for one thread"
            )
        return count
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
