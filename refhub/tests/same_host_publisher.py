"""Child process of test_same_host_transport: publishes a shard (tensors from `allocate()` or
register()'d numpy arrays), prints "ready", closes on a line from stdin."""

from __future__ import annotations

import sys

import numpy as np

from refhub import client as C

SIZES = [8 << 20, 3 << 20, 1000]


def content(i: int, n: int) -> np.ndarray:
    return np.random.default_rng(100 + i).integers(0, 255, n, dtype=np.uint8)


def main() -> None:
    server, model, how = sys.argv[1:4]
    h = C.open(model, replica="pub", server=server)
    for i, n in enumerate(SIZES):
        if how == "allocate":
            t = h.allocate(f"t{i}", (n // 4, 4) if n % 4 == 0 else n, np.uint8)
            t.reshape(-1)[:] = content(i, n)
        else:
            h.register(f"t{i}", content(i, n))
    h.publish(1)
    print("ready", flush=True)
    sys.stdin.readline()
    h.close()


if __name__ == "__main__":
    main()
