"""Fixtures for the TCP plugin tests (helpers live in tcp_helpers, a uniquely named module)."""

from tcp_helpers import client, server  # noqa: F401
