"""Two results that must agree, field by field."""

from __future__ import annotations

import math
from collections.abc import Mapping


def assert_same(actual: object, expected: object, where: str = "result", *, abs_tol: float = 1e-15) -> None:
    """Equal value for value, however deep: mappings (a dict, or a step's metrics read from the result's columns) key
    for key, lists item for item, floats to a relative 1e-12 (``abs_tol`` near 0; NaN matches NaN), everything else
    exactly. ``where``: the path named when they differ."""
    if isinstance(expected, Mapping):
        assert isinstance(actual, Mapping) and set(actual) == set(expected), where
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}.{key}", abs_tol=abs_tol)
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), where
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{where}[{index}]", abs_tol=abs_tol)
    elif isinstance(expected, float) and not isinstance(actual, bool):
        assert isinstance(actual, (float, int)), where
        assert math.isclose(actual, expected, rel_tol=1e-12, abs_tol=abs_tol) or (
            math.isnan(actual) and math.isnan(expected)
        ), f"{where}: {actual} != {expected}"
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"
