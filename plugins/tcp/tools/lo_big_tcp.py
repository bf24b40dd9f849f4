"""Run a command in a throwaway network namespace whose loopback takes TCP segments of up to
--size bytes per skb (BIG TCP for IPv4, Linux >= 6.3), or the default 64 KiB (--size 0): the
A/B of issue 17's "what a 64 KiB round trip on loopback costs" (not a test; needs root).

    python plugins/tcp/tools/lo_big_tcp.py [--size 524280] -- COMMAND [ARG...]

On loopback every skb costs a full trip through the TCP/IP stack (about 1-2 us here), and with the
default GSO limit of 64 KiB a 64 KiB message plus its header is two skbs and 256 KiB is five. A
larger `gso_ipv4_max_size` on lo lets one skb carry a whole 256 KiB message (the MTU, and so the
MSS, stay 65536). It is a host setting (`ip link set dev lo gso_ipv4_max_size N`, iproute2 >= 6.3;
set here over rtnetlink directly, as older iproute2 lacks the keyword), not a socket option, so
neither the engine nor the bare loop can set it for themselves; this tool tries it without
touching the host's own loopback. The namespace is removed afterwards, also on failure.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import subprocess
import sys

# rtnetlink (linux/if_link.h, linux/rtnetlink.h, linux/netlink.h)
RTM_NEWLINK, NLM_F_REQUEST, NLM_F_ACK, NLMSG_ERROR = 16, 1, 4, 2
IFLA_GSO_MAX_SIZE, IFLA_GRO_MAX_SIZE, IFLA_GSO_IPV4_MAX_SIZE, IFLA_GRO_IPV4_MAX_SIZE = 41, 58, 63, 64


def set_lo_gso(size: int) -> None:
    """Set lo's GSO/GRO limits (IPv6 and IPv4) to `size` in the calling process's namespace."""
    attrs = b"".join(
        struct.pack("HHI", 8, kind, size)
        for kind in (IFLA_GSO_MAX_SIZE, IFLA_GRO_MAX_SIZE, IFLA_GSO_IPV4_MAX_SIZE, IFLA_GRO_IPV4_MAX_SIZE)
    )
    body = struct.pack("BxHiII", socket.AF_UNSPEC, 0, socket.if_nametoindex("lo"), 0, 0) + attrs
    msg = struct.pack("IHHII", 16 + len(body), RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, 1, 0) + body
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as s:
        s.settimeout(5.0)
        s.sendto(msg, (0, 0))
        reply = s.recv(4096)
    kind, err = struct.unpack_from("H", reply, 4)[0], struct.unpack_from("i", reply, 16)[0]
    if kind != NLMSG_ERROR or err != 0:
        raise OSError(-err, f"setting lo's gso_ipv4_max_size to {size}: {os.strerror(-err)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=524280, help="bytes per skb on lo (0: leave the default)")
    ap.add_argument("--name", default=f"tentbig{os.getpid()}", help="the namespace's name")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)  # run inside the namespace
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("a command to run is needed (after --)")
    if a.inner:  # in the namespace: lo up, its limit set, then the command in place of this process
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=10)
        if a.size:
            set_lo_gso(a.size)
        os.execvp(cmd[0], cmd)
    subprocess.run(["ip", "netns", "add", a.name], check=True, timeout=10)
    try:
        inner = [sys.executable, os.path.abspath(__file__), "--inner", "--size", str(a.size), "--", *cmd]
        return subprocess.run(["ip", "netns", "exec", a.name, *inner], check=False).returncode
    finally:
        subprocess.run(["ip", "netns", "del", a.name], check=False, timeout=10)


if __name__ == "__main__":
    sys.exit(main())
