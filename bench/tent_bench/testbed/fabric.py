"""A real multi-rail network between Linux network namespaces, for tests and benchmarks.

`Fabric(nodes=2, rails=4, rate="1gbit")` builds `nodes` namespaces ("nodes"). Node 0 is the
publisher/server; every other node j is joined to it by `rails` veth pairs (a star). Each veth end
is shaped on its egress with `tc` (TBF by default, HTB optional), so every rail carries exactly its
rate in both directions. Rails can be re-rated, degraded, taken down and brought back while traffic
flows. The rate is counted at layer 2 (Ethernet frames), so TCP goodput is ~95-96% of it at MTU
1500 (measured here: 200mbit -> 192 Mbit/s, 2gbit -> 1.9 Gbit/s, with TBF and HTB alike).

Addresses come only from 198.18.0.0/15 (RFC 2544, reserved for network benchmarks) and live only
inside the namespaces, so parallel fabrics never clash: link k = (j - 1) * rails + i (peer node j,
rail i) is the /24 number k, i.e. 198.18.k.0/24 for k < 256 and 198.19.(k-256).0/24 after that;
node 0 is .1 on it and node j is .2. With two nodes, rail i is 198.18.i.1 <-> 198.18.i.2.

Names: namespaces are `<prefix>-n<node>`, interfaces `<prefix>-<j>r<i>a` (node 0 side) and
`<prefix>-<j>r<i>b` (node j side), at most 15 characters. The default prefix is unique per process
and per fabric, and `cleanup_stale(prefix)` deletes leftovers. Teardown always runs: on context
exit, at interpreter exit (atexit) and on SIGTERM/SIGHUP (best effort: the previous handler is
chained); deleting a namespace deletes its veth ends.

Taking a rail down (`down`) sets the *peer* (node j) end administratively down: node 0 then sees
NO-CARRIER, keeps its route, and traffic silently stops, as when a cable or switch port dies (no
socket error: connects and transfers time out). On node j itself the route is gone, so its own new
connects fail at once with ENETUNREACH.

Root and iproute2 are needed: `Fabric.available()` says whether they are there, and tests skip
otherwise. Every command runs with a timeout.
"""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tent_core.auth import new_token

log = logging.getLogger(__name__)

CMD_TIMEOUT_S = 10.0
_IFNAMSIZ = 15
_RATE_UNITS = {
    "bit": 1,
    "kbit": 10**3,
    "mbit": 10**6,
    "gbit": 10**9,
    "tbit": 10**12,
    "bps": 8,  # tc convention: "bps" means bytes per second
    "kbps": 8 * 10**3,
    "mbps": 8 * 10**6,
    "gbps": 8 * 10**9,
}
_RATE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
_counter = itertools.count()


def parse_rate(rate: str | int | float) -> int:
    """Rate in bits per second: 1e9, "1gbit", "500mbit", "2.5Gbit", "100kbit" (tc units; "mbps" = MB/s)."""
    if isinstance(rate, (int, float)):
        if rate <= 0:
            raise ValueError(f"rate must be positive: {rate}")
        return int(rate)
    m = _RATE_RE.match(rate)
    if not m:
        raise ValueError(f"bad rate {rate!r}")
    value, unit = float(m.group(1)), (m.group(2).lower() or "bit")
    if unit not in _RATE_UNITS:
        raise ValueError(f"bad rate unit in {rate!r} (use bit/kbit/mbit/gbit)")
    bps = int(value * _RATE_UNITS[unit])
    if bps <= 0:
        raise ValueError(f"rate must be positive: {rate!r}")
    return bps


def format_rate(bps: int) -> str:
    """bits/s as a tc rate string ("1gbit", "200mbit", "1500kbit"...)."""
    for unit, mult in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps >= mult and bps % mult == 0:
            return f"{bps // mult}{unit}"
    return f"{bps}bit"


def parse_fabric_spec(spec: str) -> list[int]:
    """Rails and rates from a spec: "4x1gbit" -> four 1 Gbit/s rails; "2x1gbit+1x500mbit" mixes."""
    out: list[int] = []
    for part in spec.replace(",", "+").split("+"):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"^(\d+)\s*[xX*]\s*(.+)$", part)
        count, rate = (int(m.group(1)), m.group(2)) if m else (1, part)
        if count <= 0:
            raise ValueError(f"bad rail count in {spec!r}")
        out.extend([parse_rate(rate)] * count)
    if not out:
        raise ValueError(f"empty fabric spec {spec!r}")
    return out


def _run(argv: Sequence[str], check: bool = True, timeout: float = CMD_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    log.debug("fabric: %s", " ".join(argv))
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()}")
    return p


def _mac(ns: str, ifname: str) -> str:
    out = _run(["ip", "-n", ns, "-o", "link", "show", "dev", ifname]).stdout
    parts = out.split()
    return parts[parts.index("link/ether") + 1]


def list_namespaces() -> list[str]:
    p = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def cleanup_stale(prefix: str) -> list[str]:
    """Delete every namespace named `<prefix>-n<k>` (leftovers of a killed run); returns them."""
    if not prefix:
        raise ValueError("refusing to clean up with an empty prefix")
    pat = re.compile(rf"^{re.escape(prefix)}-n\d+$")
    gone = []
    for ns in list_namespaces():
        if pat.match(ns):
            _run(["ip", "netns", "del", ns], check=False)
            gone.append(ns)
    if gone:
        log.info("fabric: removed stale namespaces %s", gone)
    return gone


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    s = ""
    while True:
        n, r = divmod(n, 36)
        s = digits[r] + s
        if n == 0:
            return s


def default_prefix() -> str:
    """Short and unique per process and fabric: "t<base36 pid>-<base36 counter>"."""
    return f"t{_base36(os.getpid())}-{_base36(next(_counter))}"


@dataclass(frozen=True)
class Link:
    """One rail: veth pair between node 0 and `peer`."""

    peer: int  # node j (>= 1)
    rail: int  # rail index i on that pair
    net: int  # /24 number k
    if0: str  # node 0 side
    if1: str  # node j side
    addr0: str
    addr1: str


def _net_addr(k: int, host: int) -> str:
    if not 0 <= k < 512:
        raise ValueError("198.18.0.0/15 holds 512 /24 links at most")
    return f"198.{18 + k // 256}.{k % 256}.{host}"


_live: weakref.WeakSet[Fabric] = weakref.WeakSet()
_hooks_lock = threading.Lock()
_hooks_installed = False


def _teardown_all() -> None:
    for fab in list(_live):
        try:
            fab.close()
        except Exception:  # pragma: no cover - best effort at exit
            log.exception("fabric teardown failed")


def _install_hooks() -> None:
    global _hooks_installed
    with _hooks_lock:
        if _hooks_installed:
            return
        _hooks_installed = True
        atexit.register(_teardown_all)
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            prev = signal.getsignal(sig)

            def handler(signum: int, frame: Any, _prev: Any = prev) -> None:
                _teardown_all()
                if callable(_prev):
                    _prev(signum, frame)
                elif _prev == signal.SIG_IGN:
                    return
                else:
                    signal.signal(signum, signal.SIG_DFL)
                    os.kill(os.getpid(), signum)

            try:
                signal.signal(sig, handler)
            except (ValueError, OSError):  # pragma: no cover
                pass


class Fabric:
    """N namespaces, `rails` shaped veth rails between node 0 and each other node; see module doc."""

    def __init__(
        self,
        nodes: int = 2,
        rails: int = 4,
        rate: str | int | Sequence[str | int] = "1gbit",
        prefix: str | None = None,
        shaper: str = "tbf",
        mtu: int = 1500,
    ) -> None:
        if nodes < 2:
            raise ValueError("a fabric needs at least 2 nodes")
        if rails < 1:
            raise ValueError("a fabric needs at least one rail")
        if shaper not in ("tbf", "htb"):
            raise ValueError("shaper must be 'tbf' or 'htb'")
        if isinstance(rate, (list, tuple)):
            if len(rate) != rails:
                raise ValueError(f"{len(rate)} rates for {rails} rails")
            self.rates = [parse_rate(r) for r in rate]
        else:
            self.rates = [parse_rate(rate)] * rails  # type: ignore[arg-type]
        if (nodes - 1) * rails > 512:
            raise ValueError("too many links for 198.18.0.0/15")
        self.nodes = nodes
        self.rails = rails
        self.prefix = prefix or default_prefix()
        self.shaper = shaper
        self.mtu = mtu
        longest = f"{self.prefix}-{nodes - 1}r{rails - 1}a"
        if len(longest) > _IFNAMSIZ:
            raise ValueError(f"prefix {self.prefix!r} too long: interface {longest!r} exceeds 15 characters")
        self.links: list[Link] = []
        for j in range(1, nodes):
            for i in range(rails):
                k = (j - 1) * rails + i
                self.links.append(
                    Link(
                        j, i, k, f"{self.prefix}-{j}r{i}a", f"{self.prefix}-{j}r{i}b", _net_addr(k, 1), _net_addr(k, 2)
                    )
                )
        self._current: dict[tuple[int, int], int] = {}  # (peer, rail) -> rate now
        # Engines in the namespaces bind 198.18.x addresses, where an auth token is mandatory: every
        # process started through exec_argv() reads the caller's TENT_AUTH_TOKEN[_FILE], or else a
        # fresh token from a private file (a path in argv, never the token itself).
        self.auth_token_file = ""
        self._up = False
        self._closed = False

    @classmethod
    def from_spec(cls, spec: str, nodes: int = 2, **kw: Any) -> Fabric:
        """Fabric from a spec such as "4x1gbit" or "2x1gbit+2x500mbit" (see parse_fabric_spec)."""
        rates = parse_fabric_spec(spec)
        return cls(nodes=nodes, rails=len(rates), rate=rates, **kw)

    # ---- availability -------------------------------------------------------------------------

    @staticmethod
    def available() -> tuple[bool, str]:
        """(True, "") when this process can build fabrics (root, ip, tc, netns support)."""
        if os.geteuid() != 0:
            return False, "needs root (network namespaces)"
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                return False, f"'{tool}' (iproute2) not found"
        name = f"{default_prefix()}-probe"
        try:
            p = _run(["ip", "netns", "add", name], check=False)
            if p.returncode != 0:
                return False, f"cannot create a network namespace: {p.stderr.strip()}"
        except (OSError, subprocess.TimeoutExpired) as e:
            return False, f"cannot run ip: {e}"
        finally:
            try:
                _run(["ip", "netns", "del", name], check=False)
            except (OSError, subprocess.TimeoutExpired):  # pragma: no cover
                pass
        return True, ""

    # ---- naming -------------------------------------------------------------------------------

    def ns(self, node: int) -> str:
        if not 0 <= node < self.nodes:
            raise IndexError(f"node {node} not in fabric of {self.nodes}")
        return f"{self.prefix}-n{node}"

    def link(self, rail: int, peer: int = 1) -> Link:
        if not 1 <= peer < self.nodes or not 0 <= rail < self.rails:
            raise IndexError(f"no rail {rail} to node {peer}")
        return self.links[(peer - 1) * self.rails + rail]

    def addrs(self, node: int, peer: int | None = None) -> list[str]:
        """Per-rail addresses of `node`. Node 0 has one per (peer, rail): pass `peer` to get just the
        rails towards that node (default: all, ordered by peer then rail)."""
        if node == 0:
            return [lk.addr0 for lk in self.links if peer is None or lk.peer == peer]
        self.ns(node)
        return [lk.addr1 for lk in self.links if lk.peer == node]

    def peer_addrs(self, node: int, peer: int = 0) -> list[str]:
        """Addresses of `peer` as seen over each rail from `node` (what a client connects to)."""
        if node == 0:
            return self.addrs(peer)
        return self.addrs(0, peer=node) if peer == 0 else []

    def exec_argv(self, node: int, argv: Sequence[str]) -> list[str]:
        ns = self.ns(node)
        if os.environ.get("TENT_AUTH_TOKEN") or os.environ.get("TENT_AUTH_TOKEN_FILE"):
            return ["ip", "netns", "exec", ns, *argv]  # the caller's token is inherited
        if not self.auth_token_file:
            fd, self.auth_token_file = tempfile.mkstemp(prefix="tent-fabric-token-")  # mode 0600
            with os.fdopen(fd, "w") as fh:
                fh.write(new_token())
        return ["ip", "netns", "exec", ns, "env", f"TENT_AUTH_TOKEN_FILE={self.auth_token_file}", *argv]

    def popen(self, node: int, argv: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start `argv` inside `node`'s namespace (the caller waits for / kills it)."""
        return subprocess.Popen(self.exec_argv(node, argv), **kw)

    def run_json(self, node: int, argv: Sequence[str], timeout_s: float, what: str) -> Any:
        """Run `argv` inside `node`'s namespace to its end (killed at `timeout_s`) and parse the last
        line of its stdout as JSON; RuntimeError naming `what` (and stderr's tail) otherwise."""
        proc = self.popen(node, argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=30)
            raise RuntimeError(f"{what} did not finish within {timeout_s:.0f} s") from None
        if proc.returncode != 0:
            raise RuntimeError(f"{what} failed (rc={proc.returncode}): {err.strip()[-2000:]}")
        lines = out.strip().splitlines()
        if not lines:
            raise RuntimeError(f"{what} printed nothing: {err.strip()[-2000:]}")
        return json.loads(lines[-1])

    def run(
        self, node: int, argv: Sequence[str], timeout: float = CMD_TIMEOUT_S, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return _run(self.exec_argv(node, argv), check=check, timeout=timeout)

    # ---- build / teardown ---------------------------------------------------------------------

    def up_all(self) -> Fabric:
        """Create everything (idempotent for a fresh fabric); torn down again if any step fails."""
        if self._up:
            return self
        if self._closed:
            raise RuntimeError("fabric already closed")
        _install_hooks()
        cleanup_stale(self.prefix)
        _live.add(self)
        self._up = True
        try:
            for node in range(self.nodes):
                _run(["ip", "netns", "add", self.ns(node)])
                _run(["ip", "-n", self.ns(node), "link", "set", "lo", "up"])
            for lk in self.links:
                n0, n1 = self.ns(0), self.ns(lk.peer)
                _run(["ip", "link", "add", lk.if0, "netns", n0, "mtu", str(self.mtu), "type", "veth",
                      "peer", "name", lk.if1, "netns", n1, "mtu", str(self.mtu)])  # fmt: skip
                _run(["ip", "-n", n0, "addr", "add", f"{lk.addr0}/24", "dev", lk.if0])
                _run(["ip", "-n", n1, "addr", "add", f"{lk.addr1}/24", "dev", lk.if1])
                self._shape(lk, self.rates[lk.rail])
                _run(["ip", "-n", n0, "link", "set", lk.if0, "up"])
                _run(["ip", "-n", n1, "link", "set", lk.if1, "up"])
                self._static_neighbours(lk)
        except BaseException:
            self.close()
            raise
        log.info("fabric %s: %d nodes, %d rails each, rates %s", self.prefix, self.nodes, self.rails,
                 [format_rate(r) for r in self.rates])  # fmt: skip
        return self

    def _static_neighbours(self, lk: Link) -> None:
        """Permanent ARP entries on both ends. A rail taken down and up must behave like a NIC
        losing and regaining its link; with dynamic ARP the kernel's neighbour entry goes
        INCOMPLETE/FAILED while the link is down and resolves again only on its ~1 s
        retransmit timer, which would dominate any failover or re-admission measurement."""
        n0, n1 = self.ns(0), self.ns(lk.peer)
        mac0 = _mac(n0, lk.if0)
        mac1 = _mac(n1, lk.if1)
        _run(["ip", "-n", n0, "neigh", "replace", lk.addr1, "lladdr", mac1, "dev", lk.if0, "nud", "permanent"])
        _run(["ip", "-n", n1, "neigh", "replace", lk.addr0, "lladdr", mac0, "dev", lk.if1, "nud", "permanent"])

    def close(self) -> None:
        """Delete the namespaces (and with them every veth). Safe to call twice."""
        if self.auth_token_file:
            try:
                os.unlink(self.auth_token_file)
            except OSError:
                pass
            self.auth_token_file = ""
        if self._closed:
            return
        self._closed = True
        _live.discard(self)
        for node in range(self.nodes):
            try:
                _run(["ip", "netns", "del", self.ns(node)], check=False)
            except (OSError, subprocess.TimeoutExpired) as e:  # pragma: no cover
                log.warning("fabric %s: could not delete namespace: %s", self.prefix, e)
        self._up = False

    def __enter__(self) -> Fabric:
        return self.up_all()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_up", False) and not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:
                pass

    # ---- shaping ------------------------------------------------------------------------------

    @staticmethod
    def _burst_bytes(bps: int) -> int:
        # >= one 64 KiB GSO super-packet (veth offloads), ~2 ms of traffic at high rates.
        return max(128 * 1024, bps // 8 // 500)

    def _shape_dev(self, ns: str, dev: str, bps: int) -> None:
        rate = f"{bps}bit"
        burst = str(self._burst_bytes(bps))
        if self.shaper == "tbf":
            _run(
                [
                    "tc",
                    "-n",
                    ns,
                    "qdisc",
                    "replace",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    burst,
                    "latency",
                    "50ms",
                ]
            )
            return
        p = _run(["tc", "-n", ns, "class", "change", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
                  "rate", rate, "ceil", rate, "burst", burst, "cburst", burst], check=False)  # fmt: skip
        if p.returncode != 0:
            _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "1"])
            _run(["tc", "-n", ns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
                  "rate", rate, "ceil", rate, "burst", burst, "cburst", burst])  # fmt: skip

    def _shape(self, lk: Link, bps: int) -> None:
        self._shape_dev(self.ns(0), lk.if0, bps)
        self._shape_dev(self.ns(lk.peer), lk.if1, bps)
        self._current[(lk.peer, lk.rail)] = bps

    def _targets(self, rail: int, peer: int | None) -> list[Link]:
        if not 0 <= rail < self.rails:
            raise IndexError(f"no rail {rail}")
        peers = range(1, self.nodes) if peer is None else [peer]
        return [self.link(rail, p) for p in peers]

    def set_rate(self, rail: int, rate: str | int, node_pair: tuple[int, int] | None = None) -> None:
        """Re-shape `rail` (both directions) to `rate`; `node_pair=(0, j)` limits it to node j's rail."""
        bps = parse_rate(rate)
        for lk in self._targets(rail, self._peer_of(node_pair)):
            self._shape(lk, bps)

    def rate(self, rail: int, peer: int = 1) -> int:
        """Current shaped rate of a rail in bits/s."""
        return self._current.get((peer, rail), self.rates[rail])

    def degrade(self, rail: int, factor: float, node_pair: tuple[int, int] | None = None) -> None:
        """Keep `factor` (0 < factor <= 1) of the rail's *nominal* rate: degrade(r, 0.25) = quarter speed."""
        if not 0 < factor <= 1:
            raise ValueError("factor is the fraction of the nominal rate kept, in (0, 1]")
        for lk in self._targets(rail, self._peer_of(node_pair)):
            self._shape(lk, max(8000, int(self.rates[rail] * factor)))

    def restore(self, rail: int, node_pair: tuple[int, int] | None = None) -> None:
        """Back to the nominal rate."""
        for lk in self._targets(rail, self._peer_of(node_pair)):
            self._shape(lk, self.rates[rail])

    def down(self, rail: int, node_pair: tuple[int, int] | None = None) -> None:
        """Take the rail down at the peer end: node 0 sees no carrier, traffic silently stops."""
        for lk in self._targets(rail, self._peer_of(node_pair)):
            _run(["ip", "-n", self.ns(lk.peer), "link", "set", lk.if1, "down"])

    def up(self, rail: int, node_pair: tuple[int, int] | None = None) -> None:
        """Bring a downed rail back (its address and shaping survive)."""
        for lk in self._targets(rail, self._peer_of(node_pair)):
            _run(["ip", "-n", self.ns(lk.peer), "link", "set", lk.if1, "up"])

    @staticmethod
    def _peer_of(node_pair: tuple[int, int] | None) -> int | None:
        if node_pair is None:
            return None
        a, b = node_pair
        if 0 not in (a, b) or a == b:
            raise ValueError("rails join node 0 and another node: node_pair must be (0, j)")
        return b if a == 0 else a

    def __repr__(self) -> str:
        return f"Fabric(prefix={self.prefix!r}, nodes={self.nodes}, rails={self.rails}, up={self._up})"


__all__ = ["Fabric", "Link", "cleanup_stale", "default_prefix", "format_rate", "parse_fabric_spec", "parse_rate"]
