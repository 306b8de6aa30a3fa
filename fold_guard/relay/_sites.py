"""The data the Relay adapter's translation hands the stages after it: a leaf module.

Translation (``_translate``: the walk of a Relay module) produces these values; evaluation
(``_engine``), the rewrite (``_rewrite``), the ledger and the offload tables read them. What a
value is, as far as folding can tell (:data:`Source`), how a folded node gets its value
(:class:`SiteKind`), the call behind each graph node (:class:`CallSite`) and the whole
:class:`Translation` of a module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping, Optional, Tuple, Union

from tvm import relay

from .._core.graph import FoldNode

__all__ = [
    "CallSite",
    "ConstSource",
    "NodeSource",
    "RuntimeSource",
    "SiteKind",
    "Source",
    "Translation",
    "TupleSource",
]


# --- What a value is, as far as folding can tell -------------------------------------------------


@dataclass(frozen=True)
class ConstSource:
    """A literal ``relay.Constant``."""

    constant: relay.Constant


@dataclass(frozen=True)
class NodeSource:
    """The output of FoldNode ``node`` (``index`` picks a field of a tuple-valued call)."""

    node: int
    index: Optional[int] = None


@dataclass(frozen=True)
class RuntimeSource:
    """Anything only known at run time: a parameter, a function call, a non-constant branch."""

    label: str


@dataclass(frozen=True)
class TupleSource:
    """A literal ``relay.Tuple``, field by field."""

    fields: Tuple[Source, ...]


Source = Union[ConstSource, NodeSource, RuntimeSource, TupleSource]


class SiteKind(Enum):
    """How a folded node gets its value."""

    EVALUATE = "evaluate"  # run the call (with constant arguments) in the interpreter
    ALLOW = "allow"  # fold_allow: the value is its operand's
    SHAPE = "shape"  # shape_of / ndarray_size of a static type: cast of a known int32 value


@dataclass(frozen=True)
class CallSite:
    """The Relay call behind FoldNode ``node_id`` and the sources of its arguments."""

    node_id: int
    function: str
    call: relay.Call
    kind: SiteKind
    args: Tuple[Source, ...]
    static_value: Optional[Tuple[int, ...]] = None  # SHAPE sites: the int32 data (shape or size)


@dataclass(frozen=True)
class Translation:
    """The graph nodes (``sites[i]`` describes ``nodes[i]``) and the Relay functions they came from."""

    nodes: Tuple[FoldNode, ...]
    sites: Tuple[CallSite, ...]
    functions: Mapping[str, Tuple[relay.GlobalVar, relay.Function]]
    #: ``If`` expressions whose condition is a node's output: once that node folds, stock picks
    #: the branch, and what reads the ``If`` may fold too (see ``walk_relay``).
    conditions: Mapping[relay.If, NodeSource] = field(default_factory=dict)
