"""Prometheus metrics of a refhub reference server (off by default; needs ``prometheus-client``).

``refhub serve --metrics-port 9465`` (or ``expose(server, 9465)``) serves /metrics on localhost.
The collector reads the server's state at scrape time (the request loop is not touched):

- ``refhub_requests_total``, ``refhub_request_errors_total`` (malformed or refused requests),
  ``refhub_handle_failures_total`` (handles failed by heartbeat timeout), ``refhub_frames_total``;
- ``refhub_handles``, ``refhub_models`` (gauges);
- per model: ``refhub_model_replicas``, ``refhub_model_available_versions``,
  ``refhub_model_latest_version`` (absent until one is available), ``refhub_model_complete_replicas``
  (replicas holding the latest version) and ``refhub_model_receiving_shards`` (shards being filled).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("refhub.metrics")


class ServerCollector:
    def __init__(self, server: Any) -> None:
        self.server = server

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        srv = self.server
        st = srv.state
        yield CounterMetricFamily("refhub_requests", "Requests the server handled.", value=st.ops)
        yield CounterMetricFamily("refhub_request_errors", "Malformed or refused requests.", value=st.errors)
        yield CounterMetricFamily("refhub_handle_failures", "Handles failed after missing heartbeats.", value=st.failures)
        yield CounterMetricFamily("refhub_frames", "ZeroMQ frames received.", value=getattr(srv, "frames", 0))
        yield GaugeMetricFamily("refhub_handles", "Open shard handles.", value=len(st.handles))
        yield GaugeMetricFamily("refhub_models", "Models the server knows.", value=len(st.models))
        fam = {
            "replicas": GaugeMetricFamily("refhub_model_replicas", "Replicas of the model.", labels=["model"]),
            "available": GaugeMetricFamily("refhub_model_available_versions", "Versions a reader can replicate.", labels=["model"]),
            "latest": GaugeMetricFamily("refhub_model_latest_version", "Newest available version.", labels=["model"]),
            "complete": GaugeMetricFamily("refhub_model_complete_replicas", "Replicas holding the latest version.", labels=["model"]),
            "receiving": GaugeMetricFamily("refhub_model_receiving_shards", "Shards being filled with a version.", labels=["model"]),
        }
        for model in list(st.models.values()):
            try:
                info = st._list(model)  # the server thread may change it meanwhile: retry at the next scrape
            except RuntimeError:
                continue
            versions = info["versions"]
            avail = [v for v, d in versions.items() if d["available"]]
            fam["replicas"].add_metric([model.name], info["replicas"])
            fam["available"].add_metric([model.name], len(avail))
            if info["latest"] is not None:
                fam["latest"].add_metric([model.name], info["latest"])
                fam["complete"].add_metric([model.name], versions[info["latest"]]["replicas"])
            fam["receiving"].add_metric([model.name], sum(d["receiving_shards"] for d in versions.values()))
        yield from fam.values()


def expose(server: Any, port: int, host: str = "127.0.0.1") -> int:
    """Serve `server`'s metrics on host:port in a daemon thread; returns the bound port."""
    try:
        import prometheus_client
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("metrics need prometheus-client: pip install prometheus-client") from exc
    registry = prometheus_client.CollectorRegistry()
    registry.register(ServerCollector(server))
    http, _thread = prometheus_client.start_http_server(port, addr=host, registry=registry)
    log.info("refhub metrics on http://%s:%d/metrics", host, http.server_port)
    return http.server_port
