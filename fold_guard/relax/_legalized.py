"""What a kernel request legalized to, remembered in the kernel cache so a warm fold skips LegalizeOps.

A warm fold compiles nothing, and then legalization is its largest step: each request (one
representative call per op signature, see ``_kernels``) goes through ``LegalizeOps``, whose
legalizers build a TE compute and a PrimFunc in Python (about 1 ms a request). What comes out is
decided by the request and by the legalizer registered for its op, so the cache keeps, per
request, the outcome: the digest of the PrimFunc (which names its compiled kernel in the cache),
which operands it takes and the type of its result, or why there is no kernel. The PrimFunc
itself is not kept (reading one back with ``tvm.ir.load_json`` costs more than legalizing it):
a kernel whose compiled code is not in the cache any more is legalized again when it is needed.

A request's key is the SHA-256 of

- the identity of the legalizer its op has in this process (:func:`legalizer_identity`): the
  module, name and bytecode of the Python function the registered ``FLegalize`` runs, and the
  values its closure holds, so a legalizer registered by the user (``register_legalize`` at a
  higher level) keys other entries than TVM's own;
- the request function's structural hash, with its operator and operand types spelled out.

The kernel cache's directory already separates fold_guard versions, TVM builds and targets.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from types import CodeType, FrameType
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import tvm
import tvm_ffi
from tvm import relax

from . import _compat

__all__ = [
    "Outcome",
    "decode_decision",
    "decode_outcome",
    "encode_decision",
    "encode_outcome",
    "legalizer_identity",
    "request_key",
]

#: A dim of a kernel's result type as stored: a static size, or the name of a request dim var.
StoredDim = Union[int, str]
#: What an entry records: ``("kernel", digest, arg_map, [(dtype, dims)...])`` or ``("none", why)``
#: for a kernel request, ``("foldable",)`` or ``("none", why)`` for a decision request.
Outcome = Tuple[Any, ...]

_LEGALIZE_ATTR = "FLegalize"
#: op name -> (the FLegalize Function it was read from, its identity or None)
_IDENTITIES: Dict[str, Tuple[Any, Optional[str]]] = {}
_IDENTITIES_LOCK = threading.Lock()


def legalizer_identity(op_name: str) -> Optional[str]:
    """Who legalizes ``op_name`` in this process: its Python legalizer's code, or None if unknown.

    The registered ``FLegalize`` is an FFI function wrapping a Python callable that cannot be read
    back, so it is called once (per registration) on ``(None, None)`` with a profile hook that
    records the first Python function entered: the legalizer, which then fails at its first
    look at the call. A legalizer that runs no Python (a native one) or that returns without
    failing has no identity here, and its requests are not cached; nor has any while a profiler
    (``sys.setprofile``) is running on the calling thread, since the hook would replace it.

    >>> legalizer_identity("relax.add").split(":")[1]
    '_binary.<locals>.binary_call_te'
    """
    op = tvm.ir.Op.get(op_name)
    registered = op.get_attr(_LEGALIZE_ATTR)
    if registered is None:
        return None
    with _IDENTITIES_LOCK:
        known = _IDENTITIES.get(op_name)
        if known is not None and known[0].same_as(registered):
            return known[1]
        if sys.getprofile() is not None:
            # A profiler (cProfile's is not a Python callable) could not be put back afterwards;
            # nothing is remembered, so the probe runs once it has stopped.
            return None
        identity = _probe(registered)
        _IDENTITIES[op_name] = (registered, identity)  # holding it keeps its address unique
        return identity


def _probe(legalizer: Any) -> Optional[str]:
    # The hook describes the frame at once and keeps only text: holding the frame would keep
    # its callers' frames alive (f_back), the whole fold that asked among them, in a cycle that
    # only the garbage collector frees.
    described: List[str] = []

    def hook(frame: FrameType, event: str, _arg: object) -> None:
        if event == "call" and not described:
            described.append(_describe_frame(frame))

    sys.setprofile(hook)
    try:
        legalizer(None, None)
    except Exception:  # noqa: BLE001 - the expected end: the legalizer reads the call's fields
        pass
    else:
        return None
    finally:
        sys.setprofile(None)
    return described[0] if described else None


def _describe_frame(frame: FrameType) -> str:
    code = frame.f_code
    closure = [_describe(frame.f_locals.get(name)) for name in code.co_freevars]
    return ":".join(
        [
            code.co_filename,
            getattr(code, "co_qualname", code.co_name),
            str(code.co_firstlineno),
            _code_digest(code),
            repr(closure),
        ]
    )


def _code_digest(code: CodeType) -> str:
    """A digest of what ``code`` does: bytecode, names and constants, nested code included.

    Not ``marshal.dumps``: its bytes depend on reference counts, so they change as a process runs.
    """
    digest = hashlib.sha256(code.co_code)
    digest.update(repr((code.co_names, code.co_varnames, code.co_freevars)).encode())
    for const in code.co_consts:
        digest.update(
            (_code_digest(const) if isinstance(const, CodeType) else repr(const)).encode()
        )
    return digest.hexdigest()[:32]


def _describe(value: object) -> str:
    if isinstance(value, CodeType):
        return _code_digest(value)
    code = getattr(value, "__code__", None)
    if isinstance(code, CodeType):
        name = getattr(value, "__qualname__", getattr(value, "__name__", "?"))
        return f"{getattr(value, '__module__', '?')}.{name}:{_describe(code)}"
    return repr(value)


def request_key(identity: str, function: relax.Function, op_name: str) -> str:
    """The cache key of legalizing ``function`` (a request calling ``op_name``) under ``identity``."""
    params = [str(_compat.type_of(param)) for param in function.params]
    material = "\n".join([identity, op_name, repr(params), str(tvm_ffi.structural_hash(function))])
    return hashlib.sha256(material.encode()).hexdigest()


def encode_outcome(
    digest: Optional[str], arg_map: Sequence[object], out_ty: object, why: str
) -> Optional[Outcome]:
    """An outcome worth storing, or None where it cannot be stored exactly.

    A kernel is stored when every operand it takes is one of the request's and every dim of its
    result is static or one of the request's dim vars (a computed dim would need its expression).
    """
    if digest is None:
        return ("none", why)
    if not all(isinstance(a, int) for a in arg_map):
        return None
    outputs: List[Tuple[str, List[StoredDim]]] = []
    for leaf in _compat.flatten_types(out_ty):
        if not isinstance(leaf, _compat.TensorType) or leaf.shape is None:
            return None
        values = getattr(leaf.shape, "values", None)
        if values is None:
            return None
        dims: List[StoredDim] = []
        for dim in values:
            if isinstance(dim, tvm.tirx.IntImm):
                dims.append(int(dim.value))
            elif isinstance(dim, tvm.tirx.Var):
                dims.append(str(dim.name))
            else:
                return None
        outputs.append((_compat.dtype_of(leaf), dims))
    return ("kernel", digest, list(arg_map), outputs)


def encode_decision(why_not: Optional[str]) -> Outcome:
    """A decision request's outcome: stock folds its calls (``why_not`` None), or why it does not."""
    return ("foldable",) if why_not is None else ("none", why_not)


def decode_decision(stored: Any) -> Optional[Tuple[Optional[str]]]:
    """``(why_not,)`` from a stored decision (``why_not`` None: stock folds), or None if malformed."""
    try:
        if list(stored) == ["foldable"]:
            return (None,)
        if stored[0] == "none" and len(stored) == 2:
            return (str(stored[1]),)
    except (IndexError, KeyError, TypeError):
        pass
    return None


def decode_outcome(
    stored: Any, dim_vars: Sequence[tvm.tirx.Var]
) -> Optional[Tuple[Optional[str], Tuple[int, ...], object, str]]:
    """``(digest, arg_map, out_ty, why)`` from a stored outcome, or None if it is malformed.

    ``dim_vars`` are the request's symbolic dims; stored dims name them.
    """
    try:
        if stored[0] == "none" and len(stored) == 2:
            return None, (), None, str(stored[1])
        kind, digest, arg_map, outputs = stored
        if kind != "kernel" or not isinstance(digest, str) or not outputs:
            return None
        by_name = {str(var.name): var for var in dim_vars}
        leaves = [
            relax.TensorType([by_name[d] if isinstance(d, str) else int(d) for d in dims], dtype)
            for dtype, dims in outputs
        ]
        out_ty = leaves[0] if len(leaves) == 1 else relax.TupleType(leaves)
        return digest, tuple(int(a) for a in arg_map), out_ty, ""
    except Exception:  # noqa: BLE001 - any malformed record (a bad dtype too) is legalized again
        return None
