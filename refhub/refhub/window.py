"""What a replicating reader's in-flight window must cover: the request delay, from batch timings.

On a shaped link that queues in one FIFO (the testbed's TBF, a switch port), a reader's READ
requests and TCP ACKs leave through its own uplink, behind whatever its own readers have in flight
from it (pipeline replication: the next hop of the chain). Then the delay between issuing a batch
and its bytes starting to flow is not the link's propagation delay but that queue, and a window
shorter than it lets the source's link idle. `RequestDelay` measures it per pull, without
sockets: each completed batch's time from submission to completion, less the time its own bytes
and those queued ahead of it take at the measured rate. (Measured on the burst testbed: 2-10 ms
along a 6-hop chain, well inside the 50 ms window; docs/benchmarks.md, "Burst".)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RequestDelay:
    """Request delay samples of one pull: mean and largest, in seconds."""

    total_s: float = 0.0
    max_s: float = 0.0
    samples: int = 0

    def observe(self, rtt_s: float, queued_bytes: int, rate_Bps: float) -> float | None:
        """One completed batch: `rtt_s` from its submission to its completion, `queued_bytes` its own
        bytes plus those of the batches still in flight ahead of it when it was submitted, at the
        measured `rate_Bps`. Returns the sample (None when there is no rate to judge by)."""
        if rate_Bps <= 0 or rtt_s < 0:
            return None
        sample = max(0.0, rtt_s - queued_bytes / rate_Bps)
        self.total_s += sample
        self.max_s = max(self.max_s, sample)
        self.samples += 1
        return sample

    @property
    def mean_s(self) -> float:
        return self.total_s / self.samples if self.samples else 0.0


def full_read_in_order(rate_Bps: float, spread_bytes: int, lag_budget_s: float, serving: bool) -> bool:
    """Whether a reader of a complete copy should send its READs in order (as waiting READs, on the
    transport's few waiting connections) rather than spread over all its connections at once.

    Spread READs land out of order, so the contiguous prefix this reader publishes as its progress
    word (what readers of its partial copy wait on: pipeline replication) trails its landed bytes by
    about what is in service at once, `spread_bytes`. At its measured rate that costs every later hop
    of a chain `spread_bytes / rate_Bps` seconds: on a 500 Mbit/s link 4 MiB is ~67 ms, on a fast
    path ~1 ms. In order, the prefix follows the bytes, but a fast path loses throughput (fewer
    connections, smaller READs: ~40% on loopback tcp). So in order exactly where a reader waits on
    this copy's progress word (`serving`: the reference server routed one to it) and the spread would
    lag by more than `lag_budget_s`; no rate measured yet: not. (The rate alone misjudges a lone fast
    reader whose process a loaded host descheduled for a while.)"""
    if not serving or rate_Bps <= 0 or spread_bytes <= 0:
        return False
    return spread_bytes / rate_Bps > lag_budget_s
