"""Conformance suites for `StepStore` and `MediaStore` implementations.

Subclass a suite in your own tests and provide the factory fixture it documents; every contract
test then runs against your store. This package's own tests do exactly that for every store it
ships. Needs `pytest` (and `hypothesis` for the property tests) at test time only.
"""
