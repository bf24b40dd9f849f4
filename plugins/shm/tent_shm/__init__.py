"""tent-shm: same-host transport for tent_core (CMA and memfd mappings)."""

__version__ = "0.1.0"
