"""Test beds: a real multi-rail network between Linux network namespaces (root only)."""

from .fabric import Fabric, Link, cleanup_stale, default_prefix, format_rate, parse_fabric_spec, parse_rate

__all__ = ["Fabric", "Link", "cleanup_stale", "default_prefix", "format_rate", "parse_fabric_spec", "parse_rate"]
