"""Fixtures for the dcgm tests; the servers live in dcgm_helpers."""

from dcgm_helpers import admin_engine, exporter, free_port  # noqa: F401 - pytest fixtures
