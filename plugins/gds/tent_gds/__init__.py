"""tent-gds: file transport for tent_core (io_uring / pread, O_DIRECT when aligned)."""

__version__ = "0.1.0"
