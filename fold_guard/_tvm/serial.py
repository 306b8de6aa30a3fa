"""One lock around every fold_guard entry point that runs TVM, so threads may call them at once.

TVM's Python pieces that fold_guard uses keep process-global state: the ``BlockBuilder`` stack
(``BlockBuilder.current()``), the TE op-tag scope that legalizers enter, the ``PassContext``
stack and the diagnostic renderer Relay's type checker reports through. Two threads inside them
at once corrupt each other's state (``BlockBuilder.current() must be self``,
``no definition of I.GlobalVar("quantize")``), and the stock passes are no safer.

The guarantee: concurrent calls of fold_guard's ``fold``, ``plan``, ``annotate``,
``fold_function`` and ``FoldConstant`` passes, on different modules or on one shared module, give
exactly the results of the same calls made one after another, and no error. They run one at a
time (the lock is held for a whole call); on two cores the work is dominated by LLVM anyway,
which the lock also serialises. The guarantee covers fold_guard's calls only: TVM code another
thread runs outside fold_guard at the same time (a stock pass, ``tvm.compile``) can still collide
with it, exactly as two stock passes collide with each other.

The lock is re-entrant: ``annotate`` plans, and a ``FoldConstant`` pass calls ``fold``. It
holds no data; the other module-level state is the policy registry and caches that never
change an answer (the pass classes per ``opt_level``, a fold's memo of type facts).
"""

from __future__ import annotations

import functools
import threading
from typing import Callable, TypeVar, cast

__all__ = ["serialized"]

_F = TypeVar("_F", bound=Callable[..., object])

_TVM_LOCK = threading.RLock()


def serialized(func: _F) -> _F:
    """``func`` run while holding fold_guard's TVM lock (see the module docstring)."""

    @functools.wraps(func)
    def locked(*args: object, **kwargs: object) -> object:
        with _TVM_LOCK:
            return func(*args, **kwargs)

    return cast(_F, locked)
