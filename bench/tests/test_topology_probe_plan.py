"""The topology probe's plans (tent_bench.refhub.topology_probe.plan): who sends which bytes to whom."""

from __future__ import annotations

import pytest
from tent_bench.refhub.topology_probe import plan

SIZE = 1_000_003  # not a multiple of N: the stripes' cuts must still cover every byte


def _covered(segs: list[tuple[int, int]]) -> bool:
    pos = 0
    for a, b in sorted(segs):
        if a != pos:
            return False
        pos = b
    return pos == SIZE


@pytest.mark.parametrize("kind", ["chain", "striped"])
@pytest.mark.parametrize("n", [1, 2, 4, 6])
def test_every_receiver_gets_every_byte_once_and_the_publisher_sends_it_once(kind: str, n: int) -> None:
    p = plan(kind, n, SIZE)
    for j in range(2, 2 + n):
        assert _covered(p[j]["recv"]), (j, p[j]["recv"])
        assert not p[j]["full"]
    assert p[1]["full"] and not p[1]["recv"]
    assert _covered([(a, b) for _, a, b in p[1]["send"]])  # the publisher's uplink carries each byte once
    sent = {j: sum(b - a for _, a, b in p[j]["send"]) for j in p}
    if kind == "striped":
        # no receiver forwards more than (N-1)/N of the bytes: every uplink within its link
        assert all(sent[j] <= SIZE * (n - 1) / n + n for j in range(2, 2 + n)), sent
    else:
        assert sent[1 + n] == 0 and all(sent[j] == SIZE for j in range(1, 1 + n)), sent
    # what is sent to a node is what it expects to receive
    for j in range(2, 2 + n):
        incoming = sorted((a, b) for s in p for d, a, b in p[s]["send"] if d == j)
        assert incoming == sorted(p[j]["recv"])
