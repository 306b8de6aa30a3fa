"""A parametrised catalogue or corpus that shrinks below its minimum stops the run at collection.

29 kinds of bad input collected, 30 required  ==>  pytest.UsageError naming the test
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

_ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
_CATALOGUE = "tests/relax/test_bad_input_catalogue.py::test_bad_input"


def _hook():
    spec = importlib.util.spec_from_file_location("fold_guard_root_conftest", _ROOT_CONFTEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.pytest_collection_modifyitems, module.MIN_CASES


def _items(count: int):
    return [SimpleNamespace(nodeid=f"{_CATALOGUE}[kind{i}]") for i in range(count)]


def test_a_shrunken_catalogue_stops_collection():
    hook, minimum = _hook()
    config = SimpleNamespace(args=["tests"])
    with pytest.raises(pytest.UsageError, match=f"test_bad_input: {minimum[_CATALOGUE] - 1} <"):
        hook(config, _items(minimum[_CATALOGUE] - 1))
    hook(config, _items(minimum[_CATALOGUE]))  # big enough: no error
    hook(SimpleNamespace(args=[f"{_CATALOGUE}[kind0]"]), _items(1))  # one case asked for by id
