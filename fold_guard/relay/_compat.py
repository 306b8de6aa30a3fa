"""Which TVM builds the Relay adapter runs on, checked before anything touches ``tvm.relay``.

Relay lived in upstream TVM up to 0.19 (removed in 0.20); the adapter uses only Relay APIs that
0.9 already had. Checking here turns "cannot import name 'relay'" or a missing attribute deep in
the adapter into one clear error that says which TVM is installed and what to install instead.
"""

from __future__ import annotations

import importlib.util
from typing import Optional, Tuple

import tvm

from .._core.errors import UnsupportedIRError
from .._tvm.versions import major_minor

__all__ = ["SUPPORTED_RELAY_TVM", "check_tvm_version"]

#: Inclusive (major, minor) range of TVM releases with the Relay APIs the adapter uses.
SUPPORTED_RELAY_TVM: Tuple[Tuple[int, int], Tuple[int, int]] = ((0, 9), (0, 19))

_INSTALL_HINT = (
    "install a TVM build with Relay, e.g. in a Python 3.10 environment "
    "`pip install hhb-tvm==3.2.3 tflite tqdm typing-extensions` (TVM 0.16), or build TVM 0.9-0.19 "
    "from source; then fold_guard with `pip install --no-deps` (its apache-tvm would overwrite "
    "that TVM)"
)


def check_tvm_version(version: Optional[str] = None, has_relay: Optional[bool] = None) -> None:
    """Raise UnsupportedIRError unless the installed TVM (or the given one) has a supported Relay.

    >>> check_tvm_version("0.16.dev0", True)
    >>> check_tvm_version("0.27.0", False)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fold_guard._core.errors.UnsupportedIRError: fold_guard.relay needs a TVM build with Relay (0.9 to 0.19); ...
    """
    version = str(tvm.__version__) if version is None else version
    if has_relay is None:
        has_relay = importlib.util.find_spec("tvm.relay") is not None
    (low, high) = SUPPORTED_RELAY_TVM
    supported = f"{low[0]}.{low[1]} to {high[0]}.{high[1]}"
    if not has_relay:
        raise UnsupportedIRError(
            f"fold_guard.relay needs a TVM build with Relay ({supported}); tvm {version} has no tvm.relay. "
            f"Hint: {_INSTALL_HINT}"
        )
    release = major_minor(version)
    if release is None or not low <= release <= high:
        raise UnsupportedIRError(
            f"fold_guard.relay supports TVM {supported}, but tvm {version} is installed. Hint: {_INSTALL_HINT}"
        )
