"""tent-ascend: Huawei Ascend NPU transport for tent_core (CANN runtime, loaded at run time)."""

__version__ = "0.1.0"
