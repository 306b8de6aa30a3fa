"""The Relax adapter's run-time settings, resolved once per run: arguments first, then environment.

Every setting a fold reads is resolved here, and only here: nothing under ``_engine`` reads
``os.environ``. An argument given to ``fold`` / ``FoldConstant`` wins; an argument left at
``None`` falls back to the environment variable, and that to the default:

==========================  ===============================  ================================
argument                    environment                      default
==========================  ===============================  ================================
``kernel_cache``            ``FOLD_GUARD_CACHE_DIR``         ``$XDG_CACHE_HOME/fold_guard``,
                            (``off`` disables it)            else ``~/.cache/fold_guard``
(none)                      ``FOLD_GUARD_CACHE_MAX_BYTES``   1 GiB, every build together
``threads``                 ``FOLD_GUARD_THREADS``           the CPUs the process may run on
``reference_engine``        ``FOLD_GUARD_REFERENCE_ENGINE``  off
==========================  ===============================  ================================

TVM's ``PassContext`` config would be the natural middle layer (``fold_guard.threads`` and the
like), but TVM 0.27 accepts only keys registered in C++ (``TVM_REGISTER_PASS_CONFIG_OPTION``):
``PassContext(config=...)`` checks every key against that registry and raises
``AttributeError: Invalid config option`` for any other, and no FFI function registers one
from Python (``transform.ListConfigs`` is the registry's only global).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional, Union

from .._core.errors import PreconditionError
from ._engine import DEFAULT_CACHE_MAX_BYTES, EngineOptions

__all__ = [
    "CACHE_DIR_ENV",
    "CACHE_MAX_BYTES_ENV",
    "REFERENCE_ENGINE_ENV",
    "THREADS_ENV",
    "CacheSetting",
    "default_cache_dir",
    "resolve_options",
]

CACHE_DIR_ENV = "FOLD_GUARD_CACHE_DIR"
CACHE_MAX_BYTES_ENV = "FOLD_GUARD_CACHE_MAX_BYTES"
THREADS_ENV = "FOLD_GUARD_THREADS"
REFERENCE_ENGINE_ENV = "FOLD_GUARD_REFERENCE_ENGINE"
_OFF = frozenset({"", "0", "off", "false", "no"})

#: ``None``: the environment decides; ``False``: no cache; ``True``: the default place; a path.
CacheSetting = Union[None, bool, str, os.PathLike]


def resolve_options(
    *,
    kernel_cache: CacheSetting = None,
    threads: Optional[int] = None,
    reference_engine: Optional[bool] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> EngineOptions:
    """The engine options of one run (see the module docstring for the order).

    >>> resolve_options(kernel_cache=False, threads=1, environ={})
    EngineOptions(reference=False, threads=1, cache_dir=None, ...)
    >>> resolve_options(environ={"FOLD_GUARD_REFERENCE_ENGINE": "1", "FOLD_GUARD_THREADS": "2"}).threads
    2
    """
    env = os.environ if environ is None else environ
    return EngineOptions(
        reference=_reference(reference_engine, env),
        threads=_threads(threads, env),
        cache_dir=_cache_dir(kernel_cache, env),
        cache_max_bytes=_cache_max_bytes(env),
    )


def default_cache_dir(environ: Optional[Mapping[str, str]] = None) -> Path:
    """``$XDG_CACHE_HOME/fold_guard``, or ``~/.cache/fold_guard`` (the XDG default)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fold_guard"


def _cache_dir(setting: CacheSetting, env: Mapping[str, str]) -> Optional[Path]:
    if setting is False:
        return None
    if setting is True:
        return default_cache_dir(env)
    if setting is not None:
        return Path(setting)
    raw = env.get(CACHE_DIR_ENV)
    if raw is not None and raw.strip().lower() in _OFF:
        return None
    return Path(raw) if raw else default_cache_dir(env)


def _cache_max_bytes(env: Mapping[str, str]) -> int:
    raw = env.get(CACHE_MAX_BYTES_ENV, str(DEFAULT_CACHE_MAX_BYTES))
    try:
        return int(raw)
    except ValueError:
        raise PreconditionError(
            f"{CACHE_MAX_BYTES_ENV}={raw!r} is not a number of bytes; hint: unset it for the "
            f"default ({DEFAULT_CACHE_MAX_BYTES}) or set e.g. {CACHE_MAX_BYTES_ENV}=268435456"
        ) from None


def _threads(threads: Optional[int], env: Mapping[str, str]) -> int:
    source, raw = "threads", threads
    if raw is None:
        source, raw = THREADS_ENV, env.get(THREADS_ENV, "").strip() or None  # type: ignore[assignment]
    if raw is None:
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            return os.cpu_count() or 1
    try:
        count = int(raw)
    except (TypeError, ValueError):
        count = 0
    if isinstance(raw, bool) or count < 1:
        raise PreconditionError(
            f"{source}={raw!r} is not a positive number of threads; hint: leave it unset to use "
            "every CPU this process may run on, or give 1 for no threads"
        )
    return count


def _reference(reference_engine: Optional[bool], env: Mapping[str, str]) -> bool:
    if reference_engine is not None:
        return bool(reference_engine)
    return env.get(REFERENCE_ENGINE_ENV, "").strip().lower() not in _OFF
