"""The registry of named policies, and turning a policy spec (a name, a policy, a list) into one.

The registry is the one piece of module-global state that changes an answer (``_tvm.serial`` lists
the rest, caches that never do): backends register their policy once, and any API that takes a
policy then accepts its name. It starts out holding the built-ins.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
from typing import Dict, Iterator, Optional, Sequence, Tuple, Union

from .builtin_policies import BUILTIN_POLICIES
from .errors import PreconditionError, UnknownPolicyError
from .policy import FoldPolicy, check_budget, compose

__all__ = [
    "PolicySpec",
    "get_policy",
    "list_policies",
    "policy_registry_scope",
    "register_policy",
    "resolve_policy",
    "unregister_policy",
    "with_budget",
]

PolicySpec = Union[str, FoldPolicy, Sequence[Union[str, FoldPolicy]]]

_REGISTRY: Dict[str, FoldPolicy] = {policy.name: policy for policy in BUILTIN_POLICIES}


def register_policy(
    policy: FoldPolicy, *, name: Optional[str] = None, replace: bool = False
) -> FoldPolicy:
    """Register ``policy`` under ``name`` (default ``policy.name``); return it.

    A name that is already registered is an error unless ``replace=True``.

    >>> from fold_guard._core.builtin_policies import size_guard
    >>> with policy_registry_scope():
    ...     _ = register_policy(size_guard(2.0, name="my-npu"))
    ...     get_policy("my-npu").name
    'my-npu'
    """
    if not isinstance(policy, FoldPolicy):
        raise PreconditionError(
            f"register_policy expects a FoldPolicy, got {type(policy).__name__}; "
            "build one with FoldPolicy(name, description, rules) or compose(...)"
        )
    key = name or policy.name
    if key in _REGISTRY and not replace:
        raise PreconditionError(
            f"a policy named {key!r} is already registered; pass replace=True to override it"
        )
    if key != policy.name:
        policy = dataclasses.replace(policy, name=key)
    _REGISTRY[key] = policy
    return policy


def unregister_policy(name: str) -> None:
    """Remove a registered policy (built-ins included; use policy_registry_scope in tests)."""
    if name not in _REGISTRY:
        raise UnknownPolicyError(_unknown_message(name))
    del _REGISTRY[name]


def get_policy(name: str) -> FoldPolicy:
    """The policy registered under ``name``; UnknownPolicyError lists the known names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownPolicyError(_unknown_message(name)) from None


def list_policies() -> Tuple[FoldPolicy, ...]:
    """Every registered policy, sorted by name (``policy.describe()`` lists its rules)."""
    return tuple(_REGISTRY[name] for name in sorted(_REGISTRY))


def resolve_policy(spec: PolicySpec) -> FoldPolicy:
    """Turn a name, a FoldPolicy, or a sequence of both (composed in order) into one FoldPolicy.

    >>> resolve_policy(["keep-qdq-weights", "size-guard"]).name
    'keep-qdq-weights+size-guard'
    """
    if isinstance(spec, FoldPolicy):
        return spec
    if isinstance(spec, str):
        return get_policy(spec)
    if isinstance(spec, (list, tuple)) and spec:
        return compose(*(resolve_policy(item) for item in spec))
    raise PreconditionError(
        f"policy must be a registered name, a FoldPolicy or a non-empty list of them, got {spec!r}; "
        f"known names: {', '.join(sorted(_REGISTRY))}"
    )


@contextlib.contextmanager
def policy_registry_scope() -> Iterator[None]:
    """Restore the registry to its current contents on exit (for tests and notebooks)."""
    saved = dict(_REGISTRY)
    try:
        yield
    finally:
        _REGISTRY.clear()
        _REGISTRY.update(saved)


def _unknown_message(name: str) -> str:
    close = difflib.get_close_matches(str(name), list(_REGISTRY), n=1, cutoff=0.6)
    suggestion = f"did you mean {close[0]!r}? " if close else ""
    return (
        f"unknown fold policy {name!r}; {suggestion}registered policies: {', '.join(sorted(_REGISTRY))}. "
        "Register a backend policy with fold_guard.register_policy(FoldPolicy(...)) first"
    )


def with_budget(spec: PolicySpec, max_fold_bytes: Optional[int]) -> FoldPolicy:
    """``spec`` resolved, with ``max_fold_bytes`` as its budget (the tighter one if it has one).

    The policy keeps its name, so reports still say which policy decided.
    """
    policy = resolve_policy(spec)
    check_budget(max_fold_bytes)
    if max_fold_bytes is None:
        return policy
    budgets = [int(max_fold_bytes)] + (
        [policy.max_fold_bytes] if policy.max_fold_bytes is not None else []
    )
    return dataclasses.replace(policy, max_fold_bytes=min(budgets))
