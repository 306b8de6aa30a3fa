"""Compile PrimFuncs into one shared library, the parts in parallel, linked by TVM's own helper.

LLVM's code generation is most of a cold fold, and it runs one module at a time. Here the
kernels are split into ``threads`` groups (balanced by a rough cost: an ``-O3`` kernel takes
about three times as long as an ``-O0`` one), each group is built and written as object files on
its own thread (TVM's build and LLVM release the GIL), and one run of
``tvm.support.cc.create_shared`` (the system compiler driver, as ``export_library`` uses it)
links them. Each kernel is built by ``tvm.tirx.build`` for its own target exactly as it would be alone, so
the split changes no code, only which object file holds it; the library's symbols are what the
loader finds, so no module needs to import another.
"""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Mapping, Tuple

import tvm
from tvm.support import cc

from .opt_level import QUICK_TARGET

__all__ = ["build_shared_library"]

#: Functions to compile: symbol -> (PrimFunc carrying that ``global_symbol``, target).
Functions = Mapping[str, Tuple[tvm.tirx.PrimFunc, str]]


def _cost(target: str) -> int:
    return 1 if target == QUICK_TARGET else 3


def _groups(functions: Functions, count: int) -> List[Dict[str, Dict[str, tvm.tirx.PrimFunc]]]:
    """``functions`` in ``count`` groups of about equal cost, each as target -> {symbol: func}."""
    groups: List[Dict[str, Dict[str, tvm.tirx.PrimFunc]]] = [{} for _ in range(count)]
    loads = [0] * count
    # Largest first into the least loaded group; ties by symbol, so the split is reproducible.
    for symbol, (func, target) in sorted(
        functions.items(), key=lambda item: (-_cost(item[1][1]), item[0])
    ):
        least = loads.index(min(loads))
        groups[least].setdefault(target, {})[symbol] = func
        loads[least] += _cost(target)
    return [group for group in groups if group]


def _write_objects(group: Dict[str, Dict[str, tvm.tirx.PrimFunc]], prefix: str) -> List[str]:
    paths = []
    for index, (target, named) in enumerate(sorted(group.items())):
        path = f"{prefix}-{index}.o"
        tvm.tirx.build(tvm.IRModule(named), target=target).write_to_file(path)
        paths.append(path)
    return paths


def build_shared_library(functions: Functions, path: str, *, threads: int = 1) -> None:
    """Compile ``functions`` into the shared library ``path`` on ``threads`` threads, one link.

    Raises what the build or the linker raises; ``path`` is then not written.

    >>> import numpy as np
    >>> from tvm import te
    >>> a = te.placeholder((3,), "float32", name="a")
    >>> func = te.create_prim_func([a, te.compute((3,), lambda i: a[i] + 1.0)])
    >>> result = tvm.runtime.empty((3,), "float32")
    >>> with tempfile.TemporaryDirectory() as workdir:
    ...     out = os.path.join(workdir, "lib.so")
    ...     build_shared_library({"add_one": (func.with_attr("global_symbol", "add_one"), "llvm")}, out)
    ...     tvm.runtime.load_module(out)["add_one"](tvm.runtime.tensor(np.arange(3, dtype="float32")), result)
    >>> result.numpy()
    array([1., 2., 3.], dtype=float32)
    """
    if not functions:
        raise ValueError("no functions to build")
    groups = _groups(functions, max(1, min(threads, len(functions))))
    with tempfile.TemporaryDirectory(prefix="fold_guard_build_") as workdir:
        prefixes = [os.path.join(workdir, f"part{index}") for index in range(len(groups))]
        if len(groups) == 1:
            objects = _write_objects(groups[0], prefixes[0])
        else:
            with ThreadPoolExecutor(len(groups), thread_name_prefix="fold_guard_build") as pool:
                parts = list(pool.map(_write_objects, groups, prefixes))
            objects = [obj for part in parts for obj in part]
        cc.create_shared(path, objects)
