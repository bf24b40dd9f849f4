"""Prometheus metrics: off by default, real scrapes over HTTP of an engine moving bytes to a peer
process, and of a refhub server."""

from __future__ import annotations

import socket
import threading
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
from peers import Peer

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tent_core import Engine, batch, errors, metrics  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, list]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


@pytest.fixture
def clean_metrics() -> Iterator[None]:
    metrics.shutdown()
    yield
    metrics.shutdown()


def test_off_by_default(clean_metrics: None) -> None:
    with Engine(transports=["tcp"]) as eng:
        assert eng.config.metrics.port == 0
        assert batch.COMPLETION_HOOK is None, "no metrics configured: nothing hooks the batch path"


def test_engine_metrics_over_http(clean_metrics: None, peer_factory) -> None:
    peer: Peer = peer_factory(size=4 << 20, transports=["tcp"])
    port = _free_port()
    eng = Engine({"metrics": {"port": port}}, transports=["tcp"])
    try:
        assert batch.COMPLETION_HOOK is not None
        dst = eng.allocate(4 << 20)
        for _ in range(5):
            eng.read(dst, peer.seg("rw"), timeout=10)
        eng.write(dst, peer.seg("rw"), 1 << 20, timeout=10)
        with pytest.raises(errors.OutOfBoundsError):
            eng.read(dst, peer.seg("rw"), 8 << 20, timeout=10)  # refused at submit: no batch
        s = scrape(port)
        rails = [x for x in s["tent_core_rail_bytes_total"] if x.labels["peer"] == peer.engine_id]
        assert rails and all(x.labels["transport"] == "tcp" and x.labels["engine"] == eng.engine_id for x in rails)
        assert sum(x.value for x in rails) >= 6 * (4 << 20) - (3 << 20)
        assert sum(x.value for x in s["tent_core_rail_slices_total"] if x.labels["peer"] == peer.engine_id) >= 6
        assert all(x.value == 0 for x in s["tent_core_rail_errors_total"])
        states = {(x.labels["rail"], x.labels["state"]): x.value for x in s["tent_core_rail_state"] if x.labels["peer"] == peer.engine_id}
        assert {st for (_, st), v in states.items() if v == 1} == {"HEALTHY"}
        assert "tent_core_rail_inflight_bytes" in s and "tent_core_rail_inflight_slices" in s
        assert "tent_core_rail_bandwidth_bytes_per_second" in s
        count = next(x.value for x in s["tent_core_batch_duration_seconds_count"])
        assert count >= 6
        done = {x.labels["outcome"]: x.value for x in s["tent_core_batches_total"]}
        assert done["done"] >= 6
        avail = {x.labels["transport"]: x.value for x in s["tent_core_transport_available"]}
        assert avail["tcp"] == 1
        # a batch that fails (the peer dies mid-way) is counted as failed
        peer.kill()
        peer.proc.wait(10)
        with pytest.raises(errors.TentError):
            eng.read(dst, peer.seg("rw"), timeout=5)
        s = scrape(port)
        outcomes = {x.labels["outcome"]: x.value for x in s["tent_core_batches_total"]}
        assert outcomes.get("failed", 0) + outcomes.get("timeout", 0) >= 1
    finally:
        eng.close()


def test_refhub_server_metrics(clean_metrics: None) -> None:
    from refhub.metrics import expose
    from refhub.server import Server

    import refhub

    srv = Server("tcp://127.0.0.1:0")
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        port = expose(srv, 0)
        w = np.arange(1 << 20, dtype=np.uint8)
        h = refhub.open("m-metrics", replica="trainer", server=srv.address)
        h.register("w", w)
        h.publish(3)
        s = scrape(port)
        assert s["refhub_requests_total"][0].value >= 2
        assert s["refhub_handles"][0].value >= 1
        latest = {x.labels["model"]: x.value for x in s["refhub_model_latest_version"]}
        assert latest["m-metrics"] == 3
        assert {x.labels["model"]: x.value for x in s["refhub_model_complete_replicas"]}["m-metrics"] == 1
        h.close()
    finally:
        srv.stop()
        t.join(5)
