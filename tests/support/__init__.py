"""Test doubles and helpers shared across tests/: one fake worker, one fault stack, waiting on conditions.

Production code never imports this package; tests in any area may.
"""
