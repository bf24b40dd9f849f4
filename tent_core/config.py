"""Every TENT knob and its default, in one place.

The policies (`slice_scheduler`, `telemetry`, `rail_monitor`, `qos`) and the engine read their
settings from the frozen dataclasses below, never from module-level constants, so a benchmark or
a test can build a variant with `dataclasses.replace` and two engines in one process can run with
different settings.

Defaults follow the C++ TENT (Mooncake `tent/`) unless a comment says why we differ; see
`notes/anchors-tent.md` section (c) for the originals.

`load_config(source)` builds an `EngineConfig` from, in increasing precedence:

1. the defaults below;
2. a TOML file (path) or a dict, laid out as top-level engine keys plus the tables
   `[scheduler]`, `[qos]`, `[health]`, `[peers]`, `[directory]` and `[metrics]`::

       request_deadline_s = 10.0
       [scheduler]
       policy = "round_robin"
       gamma = 0.2
       [health]
       cooldown_base_s = 0.5

   When `source` is None and the environment variable `TENT_CONFIG` names a file, that file is used;
3. environment variables `TENT_<FIELD>` (engine keys) and `TENT_<SECTION>_<FIELD>`
   (e.g. `TENT_SCHEDULER_GAMMA=0.2`, `TENT_HEALTH_ERROR_THRESHOLD=5`,
   `TENT_SCHEDULER_TIER_PENALTIES=1,4,8`). Values are converted to the type of the default.

Unknown keys are an error (a typo in a config file should not silently do nothing).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # stdlib from Python 3.11; the package still declares 3.10
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    import tomli as tomllib  # type: ignore[no-redef]

log = logging.getLogger(__name__)

KiB = 1024
MiB = 1024 * KiB

POLICIES = ("spray", "round_robin", "single", "stripe")
REQUIRE_AUTH_MODES = ("non_loopback", "always", "never")


@dataclass(frozen=True)
class SchedulerConfig:
    """Phase 2: slicing and rail selection (paper section 4.2, Algorithm 1)."""

    # Slices of a sprayed request are at least this long (paper: 64 KB amortizes per-slice
    # overhead while still limiting head-of-line blocking on a slow rail). C++ `block_size`.
    # Mice are not cut by it (see small_request_threshold).
    min_slice_bytes: int = 64 * KiB
    # Large requests get fewer, bigger slices instead of unbounded slice counts. C++ `max_slice_count`.
    max_slices_per_request: int = 64
    # Slice boundaries are multiples of this (page alignment keeps O_DIRECT/GPU copies happy).
    slice_align_bytes: int = 4 * KiB
    # Mice/elephant threshold theta: below it, a request goes whole to one near-best rail, one
    # slice (latency; cut only by the transport's split_bytes, as on a single-rail route); at or
    # above it, it is sliced and sprayed (throughput). C++ sprays from ~1-2 MiB (>= 16/32 slices).
    small_request_threshold: int = 1 * MiB
    # Mice pick round robin among rails whose cost is within (1 + gamma) of the best.
    gamma: float = 0.1
    # Cost model t = b0 + b1 * (A + L) / B (seconds); b0 absorbs per-request software overhead.
    b0_s: float = 20e-6
    b1: float = 1.0
    # Bandwidth estimate: peak-pick within each window, then EWMA over window peaks.
    # alpha is the weight of the NEW peak (0.5 follows a real change within ~3 windows while one
    # noisy window moves the estimate only half way).
    ewma_alpha: float = 0.5
    bandwidth_window_s: float = 0.05
    # Estimates are clamped to [lo, hi] x nominal when the nominal rate is known (paper eq. 2 caps at
    # the hardware rate; the floor keeps a stalled rail's cost finite so it can recover).
    bandwidth_floor_fraction: float = 0.001
    bandwidth_cap_fraction: float = 1.0
    # Used when a rail's nominal rate is unknown (0): 10 Gbit/s in bytes/s. It is only a prior: the
    # first measured window replaces it outright instead of being averaged with it.
    default_bandwidth_Bps: float = 1.25e9
    # The floor when the nominal rate is unknown (bytes/s). Not a fraction of the made-up prior:
    # shaped and emulated rails run at a few Mbit/s, and a floor above two rails' real rates makes
    # them look equal however different they are.
    unknown_bandwidth_floor_Bps: float = 1e4
    # Executors that report only completions (no service telemetry): a rail's rate while busy is
    # measured from one completion to a later one, over at least this many completions and at least
    # one bandwidth window (shorter spans carry over). Counting bytes per fixed window instead
    # reads "one slice per window" on a rail whose slices take longer than a window, whatever its
    # rate: two rails at 1 and 0.5 MB/s with 128 KiB slices both looked like 2.6 MB/s.
    rate_span_completions: int = 4
    # Every probe_every-th large request is sprayed evenly over all admitted rails so idle rails
    # get fresh bandwidth samples (C++: every 100th multi-slice call).
    probe_every: int = 100
    # A rail whose bandwidth estimate no fresh sample confirmed for this long, while it held no
    # work, gets one slice of the next large request or the next small one, so it is measured
    # again: samples are lower bounds, and a low one from a bad moment (a descheduled sender, a
    # cold connection) otherwise starves the rail for good, as the spray gives a slow-looking rail
    # nothing (probes off, or mice only). A rail that really is slow costs one slice per this time
    # (as the probe_every probes do: 512 KiB of a 32 MiB request, 0.5 s on a 1 MB/s rail). 0: off.
    bandwidth_stale_s: float = 2.0
    # Topology penalties by affinity tier (0 = same PCIe/NUMA domain). C++ `numa_penalties`.
    tier_penalties: tuple[float, ...] = (1.0, 5.0, 10.0)
    # Bytes a plan assigned but telemetry has not yet seen are forgotten after this long, so a lost
    # reconciliation can never pin a rail's cost high forever.
    pending_ttl_s: float = 0.05
    # "spray" (TENT), or baselines for benchmarks: "round_robin" (slices dealt in turn),
    # "single" (everything on the first admitted rail), "stripe" (equal contiguous split).
    policy: str = "spray"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"scheduler.policy must be one of {POLICIES}, not {self.policy!r}")
        if self.min_slice_bytes <= 0 or self.max_slices_per_request <= 0:
            raise ValueError("min_slice_bytes and max_slices_per_request must be positive")
        if self.slice_align_bytes <= 0 or self.min_slice_bytes % self.slice_align_bytes:
            raise ValueError("min_slice_bytes must be a positive multiple of slice_align_bytes")
        if not 0.0 < self.ewma_alpha <= 1.0:
            raise ValueError("ewma_alpha must be in (0, 1]")
        if self.unknown_bandwidth_floor_Bps <= 0 or self.rate_span_completions < 1:
            raise ValueError("unknown_bandwidth_floor_Bps must be > 0 and rate_span_completions >= 1")
        if self.gamma < 0 or self.probe_every < 0:
            raise ValueError("gamma and probe_every must be >= 0")
        if not self.bandwidth_stale_s >= 0:  # also refuses NaN
            raise ValueError("bandwidth_stale_s must be >= 0")

    def tier_penalty(self, tier: int) -> float:
        """Penalty for affinity tier `tier`; tiers past the table get the last (worst) value."""
        if not self.tier_penalties:
            return 1.0
        return self.tier_penalties[min(max(tier, 0), len(self.tier_penalties) - 1)]


@dataclass(frozen=True)
class QosConfig:
    """QoS: priority-slot rotation (paper 4.2 "Quality of Service") and cross-process rail load."""

    # Priority slots on by default, decided from a measured mixed workload (docs/benchmarks.md,
    # "QoS"): 64 KiB HIGH mice beside 64 MiB LOW elephants on 4 shaped 1 Gbit/s rails had a median
    # latency of ~420 ms without slots (queued behind elephant slices on every rail) and ~0.45 ms
    # with them, for ~10-15% of the elephants' throughput while mice are active; a flow alone
    # keeps every rail (the slots are work-conserving, see active_window_us).
    enabled: bool = True
    # Rail priority slots rotate this often (C++ `local_rotation_interval_us`).
    rotation_interval_us: int = 200
    # A priority is held back by the slots only while a higher one was planned within this window
    # (work-conserving: a lone MID/LOW flow uses every rail). 0 = always, as the C++ rotation. Long
    # enough to span the wait of a HIGH request queued behind elephants (measured up to ~0.5 s on 4
    # loaded 1 Gbit/s rails): a shorter window lets the elephants refill every rail between mice.
    active_window_us: int = 1_000_000
    # Publish per-rail queued bytes to, and read other processes' from, a host-wide table in
    # /dev/shm, so engines in different processes sharing rails see each other's load.
    shared_load: bool = True
    # Shared (cross-process) rail load table in /dev/shm.
    shared_load_name: str = "default"
    shared_load_max_rails: int = 64
    shared_load_max_procs: int = 64


@dataclass(frozen=True)
class RailHealthConfig:
    """Phase 3: rail health states HEALTHY / DEGRADED / PAUSED (paper 4.3)."""

    # Hard errors within error_window_s that pause a rail (C++ `rail_error_threshold`, window).
    error_threshold: int = 3
    # Congestion errors (e.g. RNR retry exceeded) need this multiple of the threshold.
    congestion_multiplier: int = 2
    error_window_s: float = 10.0
    # Pause cooldown: base, doubling on each repeated pause, capped. The C++ uses 30 s doubling to
    # 300 s, sized for RDMA NICs that flap for seconds. Our target is detecting a dead rail in tens of
    # milliseconds and re-admitting it soon after it returns (a veth or TCP path recovers at once):
    # with a 0.2 s base a rail that is back is used again within ~0.2-0.7 s, and one that stays dead
    # costs one small heartbeat slice per cooldown, the cooldown growing to 5 s (25 doublings would
    # be needed to reach the C++ cap; 5 doublings reach ours).
    # Heartbeats of a paused rail keep this cadence while it stays down (a failed heartbeat does not
    # lengthen it); each re-pause after a re-admission (a flapping rail) doubles it up to the cap.
    cooldown_base_s: float = 0.1
    cooldown_cap_s: float = 0.4
    # Each cooldown is spread by +-this fraction (seeded RNG), so heartbeats cannot phase-lock with a
    # periodic fault. 0 makes cooldowns exact (tests).
    cooldown_jitter: float = 0.5
    jitter_seed: int = 0x7E47
    # A rail that stays HEALTHY this long after re-admission starts its next pause at the base again.
    cooldown_reset_s: float = 30.0
    # DEGRADED rails get this weight in the spray (paper: 0.5).
    degraded_weight: float = 0.5
    # DEGRADED -> HEALTHY after this long without an error or degradation event.
    quiet_period_s: float = 0.5
    # A heartbeat probe unanswered for this long counts as a failed probe (the rail stays PAUSED,
    # with a doubled cooldown). A probe to a silently dead rail never errors, so this must exist.
    probe_timeout_s: float = 0.25
    # Gradual re-admission after a successful probe: these weights in turn, each held for
    # readmit_step_s without errors; then the rail is DEGRADED (degraded_weight) until quiet_period_s
    # passes and it is HEALTHY.
    readmit_weights: tuple[float, ...] = (0.25,)
    readmit_step_s: float = 0.1
    # Outliers (paper 4.3, "implicit signals"): a rail whose recent service rate, as a fraction of
    # its nominal rate, is below 1/outlier_ratio of the median of its usable siblings to the same
    # peer is DEGRADED for as long as that lasts (plus quiet_period_s). Spraying already shifts load
    # by measured rate; the state makes a grey rail visible and halves its share on top. Rates
    # measured longer than outlier_window_s ago are not compared (an idle rail has no fresh rate).
    outlier_ratio: float = 4.0
    outlier_window_s: float = 1.0
    # A rail that is serving slices but moved no byte for stall_s, while a sibling to the same peer
    # moved bytes within that time, is stalled: paused at once and its queued slices re-routed
    # untouched (a downed veth gives no socket error: traffic just stops). Only time in service
    # counts, never time queued. What it serves is cut short (fails, retried elsewhere) only after
    # stall_cut_s of silence: on a loaded 2-core host a healthy rail was seen silent for ~35-130 ms
    # (scheduling), and a lost TCP segment costs >= 200 ms (the minimum retransmission timeout),
    # so a false stall costs a short pause, never a slice error.
    stall_s: float = 0.1
    stall_cut_s: float = 0.3
    # The one rail of a single-rail route has its telemetry snapshots folded into its model every
    # this many health ticks (the planner gives such a rail every slice whatever its estimate, so
    # no decision reads the model in between; rail_stats() and metrics show its bandwidth up to
    # this many ticks late. What the tick acts on, completions, errors, congestion, load, is read
    # every tick, and a snapshot with an error or congestion report is folded at once). A fold
    # after 10 ms of other work is the cold tick's most expensive part, and a tick stretched the
    # one-at-a-time request it overlapped from ~0.1 to 0.3-0.5 ms (docs/benchmarks.md, the health
    # tick). 1 = every tick (as before); at most 64 (the snapshots kept meanwhile).
    single_rail_fold_ticks: int = 10

    def __post_init__(self) -> None:
        if self.error_threshold < 1 or self.congestion_multiplier < 1:
            raise ValueError("error_threshold and congestion_multiplier must be >= 1")
        if not 1 <= self.single_rail_fold_ticks <= 64:
            raise ValueError("single_rail_fold_ticks must be in [1, 64]")
        if not 0 < self.cooldown_base_s <= self.cooldown_cap_s:
            raise ValueError("need 0 < cooldown_base_s <= cooldown_cap_s")
        if not 0.0 < self.degraded_weight <= 1.0:
            raise ValueError("degraded_weight must be in (0, 1]")


@dataclass(frozen=True)
class PeerConfig:
    """Phase 3 at the peer level: retrying when every path fails, and telling a gone or silent peer
    from a passing outage (`tent_core.liveness`). A request fails only at its deadline or when no
    path can ever serve it."""

    # Slices that found no usable path wait and are retried: at once when one of the peer's rails is
    # re-admitted, else one of them every back-off step (base, doubling, capped), as a probe with
    # real data. A peer whose links return is used again within one step.
    retry_backoff_base_s: float = 0.02
    retry_backoff_cap_s: float = 0.5
    # While every path fails, the peer's control endpoint is checked (TCP connect, then a describe):
    # refused = the process is gone, so waiting requests fail at once; no answer = silent, requests
    # wait until their deadlines. Checks back off from base to cap; a dead peer is re-checked at the
    # cap's cadence and used again once it answers. Each check is bounded by check_timeout_s.
    check_backoff_base_s: float = 0.05
    check_backoff_cap_s: float = 1.0
    check_timeout_s: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.retry_backoff_base_s <= self.retry_backoff_cap_s:
            raise ValueError("need 0 < retry_backoff_base_s <= retry_backoff_cap_s")
        if not 0 < self.check_backoff_base_s <= self.check_backoff_cap_s or self.check_timeout_s <= 0:
            raise ValueError("need 0 < check_backoff_base_s <= check_backoff_cap_s and check_timeout_s > 0")


@dataclass(frozen=True)
class DirectoryConfig:
    """Cluster metadata directory (tent_core.directory); off = the embedded peer-to-peer exchange."""

    # "" keeps the embedded exchange (peers are named by their control port). "etcd://host:port[,...]"
    # publishes this engine there and resolves every peer name through it.
    url: str = ""
    # This engine's fixed name in the directory, "host:port" shaped (e.g. a Mooncake server name);
    # "" = its control endpoint.
    name: str = ""
    prefix: str = "tent/"
    # An engine that stops renewing (crashed, SIGKILLed) disappears from the directory after this long.
    lease_ttl_s: float = 10.0
    # One directory request (HTTP to etcd) fails after this long.
    timeout_s: float = 2.0


@dataclass(frozen=True)
class MetricsConfig:
    """Prometheus metrics (tent_core.metrics, needs prometheus-client); off by default."""

    # > 0: the engine registers its collector and serves /metrics on host:port (one server per process).
    port: int = 0
    # Localhost by default: metrics name peers and rails.
    host: str = "127.0.0.1"
    # Metric name prefix. Not "tent": Mooncake's C++ TENT already exports tent_* series.
    namespace: str = "tent_core"


@dataclass(frozen=True)
class PathCostConfig:
    """Phase 1: comparing a direct path with paths staged through host memory (routing.path_cost).

    A path is a pipeline of stages; each chunk pays every stage's per-chunk time once and the
    slowest stage bounds the rest. Rates come from each transport's CapabilityProfile.bandwidth_gbps
    (0 = unknown: the defaults below) and, for a target's own device copies, from what the target
    advertises."""

    # Rates assumed for a transport that advertises none.
    same_host_gbps: float = 10.0
    cross_host_gbps: float = 1.25
    # Per request (direct) or per chunk and stage (staged): software overhead of one leg.
    leg_overhead_s: float = 20e-6
    # Per chunk of a target-staged path: the control round trip that asks the target to copy.
    control_rtt_s: float = 150e-6
    # Plans are cached per class of requests (kinds, op, rule), not per size: paths are compared
    # for a request of this size.
    reference_bytes: int = 64 * MiB


@dataclass(frozen=True)
class EngineConfig:
    """Engine-level defaults plus the policy sections."""

    # A request not complete by then fails with a timeout (C++ has no request deadline by default;
    # 30 s bounds every wait an application can get stuck in).
    request_deadline_s: float = 30.0
    # Progress timeout handed to transports: a slice that moves no byte for this long *while being
    # served* fails and is retried elsewhere (C++ TENT: 10 s per slice); time queued never counts.
    # A downed veth raises no socket error at all, so this timer and the engine's stall detection
    # are what see it. It must stay above the gaps a healthy path shows (TCP's minimum
    # retransmission timeout is 200 ms on Linux), or a lost packet becomes a slice error.
    slice_timeout_s: float = 0.5
    # Retries of one slice in a row before it waits for a path to come back (C++ 8: then it fails).
    # A slice that runs out of paths waits and is retried with back-off ([peers]) until its deadline.
    max_retries_per_slice: int = 8
    # Transport substitutions per request before it fails (C++ `max_failover_attempts` 3).
    max_transport_failovers: int = 3
    # Metadata (control-port) calls to a peer fail after this long: a dead peer is an error, not a hang.
    control_timeout_s: float = 5.0
    # The cluster secret (SECURITY.md): peers prove they know it at connect with an HMAC
    # challenge-response; it never crosses the wire. `TENT_AUTH_TOKEN`, or a file holding it
    # (`auth_token_file` / `TENT_AUTH_TOKEN_FILE`: keeps it out of the environment and argv).
    auth_token: str = field(default="", repr=False)
    auth_token_file: str = ""
    # When a token is mandatory: "non_loopback" (as soon as a listener binds a non-loopback address;
    # loopback-only engines may run without one, with a warning), "always", or "never" (explicit
    # opt-out: anyone who reaches the ports can read and write registered memory).
    require_auth: str = "non_loopback"
    # Control-port bounds: requests (describe, ping) are tiny; replies carry a whole buffer list.
    control_max_request_bytes: int = 1 * MiB
    control_max_reply_bytes: int = 256 * MiB
    # ZeroMQ send queue per peer (messages); a peer that does not read loses replies beyond it.
    control_send_hwm: int = 256
    # A connection to the control port that has not completed the ZeroMQ handshake by then is dropped.
    control_handshake_ms: int = 5000
    # Raise the process's open-file soft limit to its hard limit at start: every listener caps its
    # connections, but the caps add up, and the common soft default (1024) is low for a server.
    raise_fd_limit: bool = True
    # BatchHandle.wait() polls for this long before it sleeps: waking a sleeping thread costs tens of
    # microseconds on small VMs, more than a 64 KiB copy, so small transfers finish while polling.
    # Process-wide (the last engine created sets it); 0 turns polling off.
    wait_spin_us: float = 50.0
    # The progress thread (recovery.Progress, one per process) ticks every 10 ms (recovery.HEALTH_TICK_S)
    # while anything needs watching: slices in flight, a rail not HEALTHY, a heartbeat out, a peer
    # not ALIVE, slices waiting for a path, other processes' load on a shared rail. Once nothing did
    # and no submit came for progress_idle_after_s, it ticks every progress_idle_s instead, and the
    # next submit wakes it at once (an eventfd write, paid by the first submit after the sleep
    # only): an idle engine's 100 wake-ups per second cost ~2% of a core (tent_bench.tick_cost).
    # Process-wide: the smallest value of the attached engines rules. 0 = never sleep long.
    progress_idle_s: float = 1.0
    progress_idle_after_s: float = 0.2
    # The plan cache and native submit path: a request whose class (remote segment, local buffer,
    # op, priority, tag) was planned before, to a single-rail route, is validated, sliced and handed
    # to the executor in C. False routes every request through the Python planner (for comparison).
    fast_path: bool = True
    # Requests up to this long are small and latency-sensitive (KV-cache blocks): their slices carry
    # TENT_HINT_SMALL, and executors serve them before bulk work (tcp: an express connection per
    # rail, several pipelined on one connection). Slices of larger requests never carry it, however
    # short a spray cuts them. 0 = no request is small.
    small_request_bytes: int = 256 * KiB
    # Synthesized paths (e.g. file -> staging -> TCP), the initiator's own staging: a request is cut
    # like a target-staged one (path_planner.pipeline_chunk) into about staging_chunks chunks, no
    # smaller than staging_min_chunk_bytes, no larger than staging_chunk_bytes, the size of each
    # pooled buffer. Buffers are made on demand, staging_buffers at most: an engine registers at most
    # staging_buffers * staging_chunk_bytes of staging (128 MiB with the defaults), shared by its
    # staging_workers driver threads. A 64 MiB request moves in 16 MiB chunks (4 buffers), a 4 MiB
    # one in one chunk. 4 chunks, not the target's 8: on the path-buffered benchmark both beat fixed
    # 4 MiB chunks, and 4 made half the buffers and cost less CPU (docs/benchmarks.md, path-buffered).
    staging_chunk_bytes: int = 16 * MiB
    staging_min_chunk_bytes: int = 4 * MiB
    staging_chunks: int = 4
    staging_buffers: int = 8
    staging_workers: int = 4
    # First-stage legs (e.g. file -> staging) one staged request keeps in flight. Chunks in flight in
    # one stage share it: with all four of a 64 MiB request's chunks read at once, the first ended at
    # ~80% of the read, and tcp (the second stage) started only then (docs/benchmarks.md,
    # path-direct). 1: chunk n+1 is read while chunk n is sent; that lost on a quiet host (every
    # pair), so the default keeps every chunk's read in flight (staging_buffers bounds them anyway).
    staging_first_depth: int = 8
    # Mapped paths (tent_core.mapped): a WRITE from a registered file whose file transport reads
    # through the page cache (CapabilityProfile.page_cache_files) to remote memory a transport that
    # copies its sends in the kernel (CapabilityProfile.kernel_copy_sends) reaches is sent straight
    # from a read-only shared mapping of the file: one copy per side instead of the staged path's
    # page cache -> staging copy (docs/benchmarks.md, path-buffered). False: such requests stay
    # staged. A request is mapped in windows of at most mapped_window_bytes (page aligned), each
    # window mapped once per registered file and kept while the file stays registered, at most
    # mapped_cache_bytes of windows per engine (least recently used unmapped first).
    mapped_paths: bool = True
    mapped_window_bytes: int = 256 * MiB
    mapped_cache_bytes: int = 1024 * MiB
    # Target-side staging (tent_core.target_staging): this engine copies between its own host staging
    # slots and its device memory for peers that cannot reach that memory directly. Off: peers see no
    # staging offer and such requests fail with NoPathError.
    target_staging: bool = True
    # The staging slot's size, the largest chunk of a target-staged request. A request is cut into
    # about target_staging_chunks chunks (path_planner.pipeline_chunk), no smaller than
    # target_staging_min_chunk_bytes: each chunk costs a control exchange and a submit per leg on both
    # ends (~1 ms of Python and ZeroMQ CPU per chunk, both ends together, on a 2-core host), so a
    # large request moves in 64 MiB chunks (docs/benchmarks.md, "Target-side staging": 4 -> 16 MiB
    # cut the staged path's CPU beyond its stages' from ~0.24 to ~0.07-0.13 s/GiB, 16 -> 32 MiB
    # halved the Python and ZeroMQ threads' share per GiB, ~0.05 -> ~0.03; 32 -> 64 MiB slots, with
    # half a slot first and last, cut it from 0.040-0.055 to 0.020-0.033, "Control per chunk,
    # measured"), while a small one keeps enough chunks to overlap (up to 256 MiB the chunks are as
    # with 32 MiB slots: 4-32 MiB).
    target_staging_chunk_bytes: int = 64 * MiB
    target_staging_min_chunk_bytes: int = 4 * MiB
    target_staging_chunks: int = 8
    # Staging slots (each target_staging_chunk_bytes of pinned host memory: 1 GiB at most with the
    # defaults, one session at full depth 256 MiB) shared by every session, made on demand.
    target_staging_slots: int = 16
    # Slots one session (one staged request) holds at most: how many chunks it keeps in flight.
    target_staging_depth: int = 4
    # A session idle this long (its initiator vanished) is closed and its slots reclaimed.
    target_staging_lease_s: float = 30.0
    # Administrator policy rules (tent_core.policy_rules): first match restricts/orders transports and rails.
    rules: list[dict[str, Any]] = field(default_factory=list)
    # Per-transport sections, handed to each plugin's start() as-is (e.g. {"tcp": {"rails": [...]}}).
    transports: dict[str, Any] = field(default_factory=dict)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    qos: QosConfig = field(default_factory=QosConfig)
    health: RailHealthConfig = field(default_factory=RailHealthConfig)
    peers: PeerConfig = field(default_factory=PeerConfig)
    directory: DirectoryConfig = field(default_factory=DirectoryConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    path_cost: PathCostConfig = field(default_factory=PathCostConfig)

    def __post_init__(self) -> None:
        if self.require_auth not in REQUIRE_AUTH_MODES:
            raise ValueError(f"require_auth must be one of {REQUIRE_AUTH_MODES}, not {self.require_auth!r}")
        if self.control_max_request_bytes < 4096 or self.control_max_reply_bytes < 4096 or self.control_send_hwm < 1:
            raise ValueError("control_max_*_bytes must be >= 4096 and control_send_hwm >= 1")
        if self.target_staging_chunk_bytes < 1 or self.target_staging_min_chunk_bytes < 1 or self.target_staging_chunks < 1:
            raise ValueError("target_staging_chunk_bytes, target_staging_min_chunk_bytes and target_staging_chunks must be >= 1")
        if self.staging_chunk_bytes < 1 or self.staging_min_chunk_bytes < 1 or self.staging_chunks < 1 or self.staging_buffers < 1:
            raise ValueError("staging_chunk_bytes, staging_min_chunk_bytes, staging_chunks and staging_buffers must be >= 1")
        if self.staging_first_depth < 1:
            raise ValueError("staging_first_depth must be >= 1")
        if self.mapped_window_bytes < 4096 or self.mapped_window_bytes % 4096 or self.mapped_cache_bytes < 0:
            raise ValueError("mapped_window_bytes must be a positive multiple of 4096 and mapped_cache_bytes >= 0")


_SECTIONS: dict[str, type] = {
    "scheduler": SchedulerConfig,
    "qos": QosConfig,
    "health": RailHealthConfig,
    "peers": PeerConfig,
    "directory": DirectoryConfig,
    "metrics": MetricsConfig,
    "path_cost": PathCostConfig,
}
ENV_PREFIX = "TENT_"


def _coerce(value: Any, default: Any, key: str) -> Any:
    """Convert `value` (from TOML or a string from the environment) to the type of `default`."""
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{key}: expected a boolean, got {value!r}")
    if isinstance(default, int):
        if isinstance(value, str):
            return int(value.strip().replace("_", ""), 0)
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{key}: expected an integer, got {value!r}")
        return int(value)
    if isinstance(default, float):
        return float(value)
    if isinstance(default, tuple):
        items = value.split(",") if isinstance(value, str) else list(value)
        elem = default[0] if default else 0.0
        return tuple(_coerce(v, elem, key) for v in items if not (isinstance(v, str) and not v.strip()))
    if isinstance(default, str):
        return str(value)
    return value


def _apply(obj: Any, values: Mapping[str, Any], where: str) -> Any:
    """Return a copy of dataclass `obj` with `values` merged in (nested sections recurse)."""
    fields = {f.name: f for f in dataclasses.fields(obj)}
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in fields:
            raise KeyError(f"unknown config key {where}{key!r}")
        current = getattr(obj, key)
        if isinstance(current, Mapping):
            if not isinstance(value, Mapping):
                raise TypeError(f"config key {where}{key!r} must be a table")
            changes[key] = {**current, **{k: dict(v) if isinstance(v, Mapping) else v for k, v in value.items()}}
        elif dataclasses.is_dataclass(current):
            if not isinstance(value, Mapping):
                raise TypeError(f"config section {where}{key!r} must be a table")
            changes[key] = _apply(current, value, f"{where}{key}.")
        else:
            changes[key] = _coerce(value, current, f"{where}{key}")
    return dataclasses.replace(obj, **changes) if changes else obj


def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    """Collect `TENT_*` variables into a nested dict; unknown names are ignored (logged at debug)."""
    top = {f.name for f in dataclasses.fields(EngineConfig)} - set(_SECTIONS) - {"transports"}
    out: dict[str, Any] = {}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name == "TENT_CONFIG":
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        for section, cls in _SECTIONS.items():
            if rest.startswith(section + "_"):
                key = rest[len(section) + 1 :]
                if key in {f.name for f in dataclasses.fields(cls)}:
                    out.setdefault(section, {})[key] = value
                    break
        else:
            if rest in top:
                out[rest] = value
            else:
                log.debug("ignoring environment variable %s (not a config key)", name)
    return out


def load_config(
    source: Mapping[str, Any] | str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> EngineConfig:
    """Defaults, then `source` (dict or TOML path; `$TENT_CONFIG` if None), then `TENT_*` env vars.

    `env` defaults to `os.environ`; pass `{}` to ignore the environment (tests, embedding).
    """
    env = os.environ if env is None else env
    cfg = EngineConfig()
    if source is None and env.get("TENT_CONFIG"):
        source = env["TENT_CONFIG"]
    if source is not None:
        if isinstance(source, Mapping):
            data: Mapping[str, Any] = source
        else:
            with Path(source).open("rb") as fh:
                data = tomllib.load(fh)
            log.debug("loaded TENT config from %s", source)
        cfg = _apply(cfg, data, "")
    overrides = _env_overrides(env)
    if overrides:
        cfg = _apply(cfg, overrides, "env:")
    return cfg


__all__ = [
    "POLICIES",
    "DirectoryConfig",
    "EngineConfig",
    "MetricsConfig",
    "PathCostConfig",
    "PeerConfig",
    "QosConfig",
    "RailHealthConfig",
    "SchedulerConfig",
    "load_config",
]
