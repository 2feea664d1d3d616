"""Builders and references the tests share; no test module imports another (tests/test_architecture.py)."""
