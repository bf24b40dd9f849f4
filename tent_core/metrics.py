"""Prometheus metrics for TENT engines (off by default; needs ``prometheus-client``).

Pull-style: a custom collector reads each attached engine's rail table, health states and
transports when Prometheus scrapes, so the transfer path does not change. The one push-style piece is
the batch latency histogram: while metrics are on, `tent_core.batch` calls a hook when a batch's
completion is observed (wait() or poll()); with metrics off that hook is None and costs one check.

Turn on with the engine config (``[metrics] port = 9464``, or ``TENT_METRICS_PORT=9464``) or in code:

    from tent_core import metrics
    metrics.attach(engine)            # collect this engine
    metrics.serve(9464)               # /metrics on 127.0.0.1:9464 (one server per process)

Names follow Prometheus conventions: base units (bytes, seconds), ``_total`` for counters, the
namespace ``tent_core`` (Mooncake's C++ TENT already exports ``tent_*`` series). Series:

- ``tent_core_rail_bytes_total``, ``..._rail_slices_total``, ``..._rail_errors_total`` (counters), labels
  ``engine, transport, peer, rail`` (one series per rail: peers x rails, as many as the engine has);
- ``tent_core_rail_inflight_bytes``, ``..._rail_inflight_slices`` (gauges: the rail's queue depth);
- ``tent_core_rail_bandwidth_bytes_per_second`` (the engine's current estimate);
- ``tent_core_rail_state{state="HEALTHY|DEGRADED|PAUSED"}`` (1 for the rail's state, 0 otherwise);
- ``tent_core_transport_available{engine, transport}`` (1/0) and ``tent_core_peers{engine}``;
- ``tent_core_batch_duration_seconds`` (histogram, submit to observed completion, successful batches)
  and ``tent_core_batches_total{outcome="done|failed|cancelled|timeout"}``.

Several processes on one host each serve their own port (prometheus-client's multiprocess mode does not
support custom collectors); give each process its own ``metrics.port``.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from . import batch as _batch
from .config import MetricsConfig

if TYPE_CHECKING:
    from .batch import BatchHandle
    from .engine import Engine

log = logging.getLogger(__name__)

RAIL_STATES = ("HEALTHY", "DEGRADED", "PAUSED")
# 10 us .. 30 s: a 4 KiB same-host copy to a 64 GiB checkpoint over one NIC
LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0)

_lock = threading.Lock()
_engines: weakref.WeakSet[Engine] = weakref.WeakSet()
_state: dict[str, Any] = {}  # namespace, registry, collector, histogram, counter, server


def _require() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("metrics need prometheus-client: pip install 'tent-core[metrics]'") from exc
    return prometheus_client


class EngineCollector:
    """Reads the attached engines at scrape time."""

    def __init__(self, namespace: str) -> None:
        self.ns = namespace

    def describe(self) -> list:
        return []  # unchecked collector: families vary with the engines attached

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        ns = self.ns
        rail_labels = ["engine", "transport", "peer", "rail"]
        fam = {
            "bytes": CounterMetricFamily(f"{ns}_rail_bytes", "Bytes moved on the rail.", labels=rail_labels),
            "slices": CounterMetricFamily(f"{ns}_rail_slices", "Slices completed on the rail.", labels=rail_labels),
            "errors": CounterMetricFamily(f"{ns}_rail_errors", "Slices that failed on the rail.", labels=rail_labels),
            "inflight_bytes": GaugeMetricFamily(f"{ns}_rail_inflight_bytes", "Bytes queued or in flight on the rail.", labels=rail_labels),
            "inflight_slices": GaugeMetricFamily(f"{ns}_rail_inflight_slices", "Slices queued or in flight on the rail.", labels=rail_labels),
            "bandwidth": GaugeMetricFamily(f"{ns}_rail_bandwidth_bytes_per_second", "The engine's bandwidth estimate of the rail.", labels=rail_labels),
            "state": GaugeMetricFamily(f"{ns}_rail_state", "Rail health: 1 for its current state.", labels=[*rail_labels, "state"]),
        }
        avail = GaugeMetricFamily(f"{ns}_transport_available", "1 if the transport runs in this engine.", labels=["engine", "transport"])
        peers = GaugeMetricFamily(f"{ns}_peers", "Peers this engine has metadata for.", labels=["engine"])
        for eng in list(_engines):
            if getattr(eng, "_closed", False):
                continue
            eid = eng.engine_id
            for name, a in sorted(eng.availability.items()):
                avail.add_metric([eid, name], 1.0 if a.available and name in eng.transports else 0.0)
            peers.add_metric([eid], float(sum(1 for p in eng.peers.peers() if p.engine_id != eid)))
            try:
                rows = eng.rail_stats()
            except RuntimeError:  # a peer table changed under the scrape: report the next time
                continue
            for r in rows:
                lab = [eid, r["transport"], r["peer"], r["rail"]]
                fam["bytes"].add_metric(lab, r["bytes"])
                fam["slices"].add_metric(lab, r["slices"])
                fam["errors"].add_metric(lab, r["errors"])
                fam["inflight_bytes"].add_metric(lab, r["inflight_bytes"])
                fam["inflight_slices"].add_metric(lab, r.get("inflight_slices", 0))
                fam["bandwidth"].add_metric(lab, r["bandwidth_GBps"] * 1e9)
                for st in RAIL_STATES:
                    fam["state"].add_metric([*lab, st], 1.0 if r["state"] == st else 0.0)
        yield from fam.values()
        yield avail
        yield peers


def _on_batch_done(handle: BatchHandle, outcome: str) -> None:
    st = _state
    if outcome == "done":
        st["latency"].observe(time.monotonic() - handle.submitted_at)
    st["batches"].labels(outcome).inc()


def _setup(namespace: str, registry: Any = None) -> None:
    prom = _require()
    with _lock:
        if _state:
            if _state["namespace"] != namespace:
                log.warning("metrics already use namespace %s; ignoring %s", _state["namespace"], namespace)
            return
        reg = registry or prom.REGISTRY
        collector = EngineCollector(namespace)
        reg.register(collector)
        latency = prom.Histogram(f"{namespace}_batch_duration_seconds", "Seconds from submit() to a batch's observed completion.",
                                 buckets=LATENCY_BUCKETS, registry=reg)
        batches = prom.Counter(f"{namespace}_batches", "Batches by outcome.", ["outcome"], registry=reg)
        _state.update(namespace=namespace, registry=reg, collector=collector, latency=latency, batches=batches, server=None)
        _batch.COMPLETION_HOOK = _on_batch_done


def attach(engine: Engine, config: MetricsConfig | None = None, registry: Any = None) -> None:
    """Collect `engine`'s metrics; with `config.port`, also serve /metrics (once per process)."""
    cfg = config or MetricsConfig()
    _setup(cfg.namespace, registry)
    _engines.add(engine)
    if cfg.port:
        serve(cfg.port, cfg.host)


def detach(engine: Engine) -> None:
    _engines.discard(engine)


def serve(port: int, host: str = "127.0.0.1") -> int:
    """Serve /metrics over HTTP in a daemon thread (idempotent). Returns the bound port."""
    prom = _require()
    if not _state:
        _setup(MetricsConfig().namespace)
    with _lock:
        if _state.get("server") is not None:
            bound = _state["server"][0].server_port
            if port and port != bound:
                log.warning("metrics already served on port %d; not starting another on %d", bound, port)
            return bound
        server, thread = prom.start_http_server(port, addr=host, registry=_state["registry"])
        _state["server"] = (server, thread)
        log.info("Prometheus metrics on http://%s:%d/metrics", host, server.server_port)
        return server.server_port


def shutdown() -> None:
    """Stop serving and unregister everything (tests; a process normally keeps its metrics)."""
    with _lock:
        if not _state:
            return
        _batch.COMPLETION_HOOK = None
        srv = _state.get("server")
        if srv is not None:
            srv[0].shutdown()
            srv[0].server_close()
        reg = _state["registry"]
        for c in (_state["collector"], _state["latency"], _state["batches"]):
            try:
                reg.unregister(c)
            except KeyError:
                pass
        _state.clear()
        _engines.clear()


__all__ = ["EngineCollector", "attach", "detach", "serve", "shutdown"]
