"""cuda-python results are (error, value...) tuples; what the bindings backend takes from them.

An H200 run found the driver-API helper dropping two-value results: cuMemGetAddressRange's
(error, base, size) came back as None, every allocation base read as 0, and CUDA IPC export of
every buffer failed with "invalid argument"."""

from tent_core.cuda import result_values


def test_no_value_one_value_and_several_values() -> None:
    assert result_values((0,)) is None
    assert result_values((0, 42)) == 42
    assert result_values((0, 0x7F00_0000_0000, 1 << 20)) == (0x7F00_0000_0000, 1 << 20)
    base, size = result_values((0, 7, 9))
    assert (base, size) == (7, 9)
