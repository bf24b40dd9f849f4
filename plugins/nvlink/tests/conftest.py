import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tent_nvlink.cuda import device_status

    n, why = device_status()
    if n:
        return
    skip = pytest.mark.skip(reason=f"no CUDA device: {why}")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
