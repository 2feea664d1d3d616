"""Two results that must agree, field by field."""

from __future__ import annotations

from collections.abc import Mapping

import pytest


def assert_same(a: object, b: object, path: str = "") -> None:
    if isinstance(a, Mapping):  # a dict, or a step's metrics read from the result's columns
        assert isinstance(b, Mapping) and set(a) == set(b), path
        for key in a:
            assert_same(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert b == pytest.approx(a, rel=1e-12, abs=1e-15), path
    else:
        assert a == b, path
