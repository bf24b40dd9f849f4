"""tent_bench.refhub.link_sample: its parsers on the real tools' output, and the per-round summary."""

from __future__ import annotations

import shutil
import socket
import subprocess

import pytest
from tent_bench.refhub import link_sample


@pytest.mark.skipif(shutil.which("ss") is None, reason="no ss")
def test_parse_ss_reads_a_live_connection() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    cli = socket.create_connection(srv.getsockname())
    peer, _ = srv.accept()
    try:
        cli.sendall(b"x" * 300_000)
        got = 0
        while got < 300_000:
            got += len(peer.recv(1 << 20))
        port = cli.getsockname()[1]
        out = subprocess.run(["ss", "-tinH", "state", "established", f"sport = :{port}"], capture_output=True,
                             text=True, timeout=10).stdout
        conns = link_sample.parse_ss(out)
        assert len(conns) == 1, out
        c = conns[0]
        assert c["peer"] == "127.0.0.1"
        assert c["bytes_sent"] >= 300_000
        assert c["srtt_ms"] is not None and c["srtt_ms"] >= 0
        assert c["cwnd"] and c["mss"]
    finally:
        for s in (cli, peer, srv):
            s.close()


@pytest.mark.skipif(shutil.which("tc") is None, reason="no tc")
def test_parse_tc_reads_a_qdisc() -> None:
    out = subprocess.run(["tc", "-s", "qdisc", "show", "dev", "lo"], capture_output=True, text=True, timeout=10).stdout
    backlog, dropped = link_sample.parse_tc(out)
    assert backlog is not None and backlog >= 0
    assert dropped is not None and dropped >= 0
    assert link_sample.parse_tc("garbage") == (None, None)


def _sample(t: float, sent: int, pub_q: int, reader_q: int) -> dict:
    conn = {"peer": "198.18.0.6", "srtt_ms": 5.0, "cwnd": 200, "unacked": 100, "mss": 1000, "bytes_sent": sent}
    return {"t": t, "q": {1: (pub_q, 0), 2: (reader_q, 0), 3: (0, 0)}, "pub": [conn]}


def test_per_round_takes_the_busy_connections_reader() -> None:
    s = link_sample.Sampler(0.04)
    s.marks = [10.0, 20.0, 20.0]  # a round of N = 1, then one of N = 2 (two replicate commands)
    s.samples = [_sample(10.1, 0, 0, 0), _sample(10.2, 1 << 20, 500_000, 0), _sample(10.3, 2 << 20, 0, 0),
                 _sample(20.1, 3 << 20, 0, 0), _sample(20.2, 4 << 20, 100_000, 300_000),
                 _sample(20.3, 4 << 20, 0, 0)]  # the last: nothing sent since, not counted
    rows = link_sample.per_round(s, [1, 2], {"198.18.0.6": 2})
    assert [r["n"] for r in rows] == [1, 2]
    assert rows[0]["samples"] == 2 and rows[0]["pub_uplink_empty"] == "1/2"
    assert rows[0]["pub_uplink_queue_KB"] == 250.0
    assert rows[1]["samples"] == 1 and rows[1]["reader_uplink_queue_KB"] == 300.0
    assert rows[1]["pub_unacked_KB"] == 100.0 and rows[1]["pub_cwnd_KB"] == 200.0
