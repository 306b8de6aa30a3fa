"""fold_guard's passes behave like the stock ``FoldConstant`` under pass management.

The stock passes do their internal work (legalizing a call, type inference, building a kernel)
without the caller's pass instruments seeing extra IR-level passes. fold_guard runs
``LegalizeOps``, ``InferType`` and TIR builds internally, so it runs them in a context of its own:
the caller's ``opt_level`` and config (which TIR lowering reads, so kernels are built as the
caller's stock pass would build them), but none of its instruments, trace, or required and
disabled pass lists (``disabled_pass=["FoldConstant"]`` must disable the pass itself, not
``LegalizeOps`` inside it).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import tvm

__all__ = ["PASS_NAME", "isolated_pass_context"]

#: The name our passes register under: ``PassContext(disabled_pass=["FoldConstant"])`` and
#: ``required_pass`` treat them exactly like the stock pass they replace.
PASS_NAME = "FoldConstant"


@contextlib.contextmanager
def isolated_pass_context() -> Iterator[None]:
    """Enter a PassContext with the caller's opt_level and config, and nothing else."""
    current = tvm.transform.PassContext.current()
    config = {str(key): value for key, value in current.config.items()}
    with tvm.transform.PassContext(opt_level=current.opt_level, config=config):
        yield
