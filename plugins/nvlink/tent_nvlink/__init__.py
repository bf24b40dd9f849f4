"""tent-nvlink: same-host GPU transport for tent_core (CUDA IPC, loaded at runtime)."""

__version__ = "0.1.0"
