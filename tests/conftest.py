from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from peers import Peer


@pytest.fixture
def peer_factory() -> Iterator[Any]:
    peers: list[Peer] = []

    def make(**kw: Any) -> Peer:
        p = Peer(**kw)
        peers.append(p)
        return p

    yield make
    for p in peers:
        p.close()
