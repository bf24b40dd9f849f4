"""The conformance kit against every installed transport, run as a plugin author would run it;
and against transports that break the contract on purpose, to show the kit catches them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tent_core.conformance import CHECKS
from tent_core.plugin_manager import discover, instantiate

INSTALLED = sorted(discover().registry.entries)
MUST_RUN = {"tcp", "shm", "gds"}  # available on any Linux host: the kit must pass there, not skip
WAIT_CHECKS = {"wait_read_parks", "wait_read_deadline", "wait_read_word_access", "wait_read_malformed", "wait_read_bound"}


def kit(name: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run([sys.executable, "-m", "tent_core.conformance", name, "--json", *args], capture_output=True,
                          text=True, timeout=300, env=env)  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.parametrize("name", INSTALLED)
def test_installed_transport_conforms(name: str) -> None:
    rc, report = kit(name)
    assert {"transport", "passed", "failed", "skipped", "checks"} <= set(report)
    assert report["transport"] == name and [c["name"] for c in report["checks"]] == list(CHECKS)
    failed = [f"{c['name']}: {c['detail']}" for c in report["checks"] if c["status"] == "failed"]
    assert rc == 0 and not failed, failed
    assert report["passed"] + report["skipped"] == len(CHECKS)
    for c in report["checks"]:
        if c["status"] == "skipped":
            assert c["detail"], f"{c['name']} skipped without a reason"
    transport, avail = instantiate(discover().registry.entries[name])
    core = {"read_write_exact", "zero_length", "unaligned", "concurrent", "all_or_nothing_submit", "exactly_once_on_close"}
    passed = {c["name"] for c in report["checks"] if c["status"] == "passed"}
    if name in MUST_RUN:
        assert avail.available, f"{name}: {avail.reason}"
        assert core <= passed, report
    # waiting READs: optional; checked wherever declared (tcp does), skipped with the reason elsewhere
    waits = {c["name"]: c for c in report["checks"] if c["name"].startswith("wait_read")}
    assert set(waits) == WAIT_CHECKS
    if name == "tcp":
        assert all(c["status"] == "passed" for c in waits.values()), waits
    elif name in MUST_RUN:
        assert all(c["status"] == "skipped" and "Transport.wait_read" in c["detail"] for c in waits.values()), waits
    elif report["reason"]:  # unavailable here, or serving memory kinds the kit does not exercise
        assert report["skipped"] == len(CHECKS) and (avail.available or avail.reason in report["reason"]), report
    else:
        assert core <= passed, report

def test_usage_errors() -> None:
    out = subprocess.run([sys.executable, "-m", "tent_core.conformance", "no-such-transport"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "not installed" in out.stderr
    out = subprocess.run([sys.executable, "-m", "tent_core.conformance", "tcp", "--config", '{"conns_per_rial": 2}'],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "conns_per_rial" in out.stderr


# Transports that lie: each claims what it does not do. Installed as a distribution on PYTHONPATH
# (entry point and all), so the kit finds them the way it finds any plugin.
LIARS = '''
from tent_core.plugin_spec import hookimpl
from tent_core.executor import EXECUTOR_ABI_VERSION
from tent_core.transport import AccessControl
from tent_shm.plugin import ShmTransport
from tent_tcp.transport import TcpTransport


class ClaimsToRefuse(ShmTransport):
    """CMA reaches the whole address space, but this one claims its links refuse bad ranges."""
    name = "liar_cma"

    def start(self, ctx):
        ctx.config = {**ctx.config, "mode": "cma"}  # CMA is opt-in (both sides): this one always opts in
        super().start(ctx)

    def access_control(self, link):
        return AccessControl()


class ForgetsToRevoke(TcpTransport):
    """release_buffer() that leaves the region registered."""
    name = "liar_revoke"

    def release_buffer(self, buf):
        pass


class ClaimsToReachAll(ShmTransport):
    """memfd mode (the default) cannot map plain memory, but this one never says so."""
    name = "liar_reach_all"

    def buffer_unreachable(self, peer, buffer, link):
        return None


class ClaimsToWait(ShmTransport):
    """Declares waiting READs, but its executor never asks for their conditions (plain READs)."""
    name = "liar_wait"
    wait_read = True


class ParksWithoutBound(TcpTransport):
    """Says which config sets the parking bound the kit asks for, but leaves it at 64."""
    name = "liar_wait_bound"

    def wait_config(self, max_parked, max_wait_ms):
        return {**super().wait_config(max_parked, max_wait_ms), "wait_max_parked": 64}


class WaitsWithoutConfig(TcpTransport):
    """Honest waiting READs, but no config entries that set the parking bound (wait_config: None)."""
    name = "wait_no_config"

    def wait_config(self, max_parked, max_wait_ms):
        return None


class ClaimsToReachNone(TcpTransport):
    """Rules out every buffer, yet its executor reaches them."""
    name = "liar_reach_none"

    def buffer_unreachable(self, peer, buffer, link):
        return "cannot reach anything (a lie)"


@hookimpl
def tent_register_transports(registry):
    registry.add("liar_cma", ClaimsToRefuse, abi_version=EXECUTOR_ABI_VERSION)
    registry.add("liar_revoke", ForgetsToRevoke, abi_version=EXECUTOR_ABI_VERSION)
    registry.add("liar_reach_all", ClaimsToReachAll, abi_version=EXECUTOR_ABI_VERSION)
    registry.add("liar_reach_none", ClaimsToReachNone, abi_version=EXECUTOR_ABI_VERSION)
    registry.add("liar_wait", ClaimsToWait, abi_version=EXECUTOR_ABI_VERSION)
    registry.add("liar_wait_bound", ParksWithoutBound, abi_version=EXECUTOR_ABI_VERSION)
    registry.add("wait_no_config", WaitsWithoutConfig, abi_version=EXECUTOR_ABI_VERSION)
'''


@pytest.fixture(scope="module")
def liars(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if not {"tcp", "shm"} <= set(INSTALLED):
        pytest.skip("needs tcp and shm")
    root: Path = tmp_path_factory.mktemp("liars")
    (root / "tent_liars.py").write_text(textwrap.dedent(LIARS))
    info = root / "tent_liars-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tent-liars\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[tent_core.transports]\nliars = tent_liars\n")
    return dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


def test_kit_catches_a_link_that_does_not_refuse_what_it_claims(liars: dict[str, str]) -> None:
    rc, report = kit("liar_cma", "--check", "bounds", "--check", "permission", "--check", "release_buffer", env=liars)
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert rc == 1 and status == {"bounds": "failed", "permission": "failed", "release_buffer": "failed"}, report


def test_kit_catches_a_release_that_revokes_nothing(liars: dict[str, str]) -> None:
    rc, report = kit("liar_revoke", "--check", "release_buffer", "--check", "read_write_exact", env=liars)
    status = {c["name"]: c for c in report["checks"]}
    assert rc == 1 and status["release_buffer"]["status"] == "failed", report
    assert "succeeded" in status["release_buffer"]["detail"] and status["read_write_exact"]["status"] == "passed"


def test_kit_catches_false_reachability_claims(liars: dict[str, str]) -> None:
    """buffer_unreachable() is what the core plans by: a transport that claims to reach memory its
    executor cannot (the plain buffer, over memfd mappings), or rules out memory it does reach,
    fails the buffer_reach check; the honest shm and tcp pass it (test_installed_transport_conforms)."""
    rc, report = kit("liar_reach_all", "--check", "buffer_reach", env=liars)
    (check,) = report["checks"]
    assert rc == 1 and check["status"] == "failed" and "plain" in check["detail"], report
    rc, report = kit("liar_reach_none", "--check", "buffer_reach", env=liars)
    (check,) = report["checks"]
    assert rc == 1 and check["status"] == "failed" and "reached it" in check["detail"], report


def test_kit_catches_a_transport_that_claims_waiting_reads_it_does_not_do(liars: dict[str, str]) -> None:
    """shm answers every READ at once: declaring wait_read, it fails the checks that need a READ to
    park until its word arrives or to fail at its deadline (the honest shm skips them)."""
    rc, report = kit("liar_wait", "--check", "wait_read_parks", "--check", "wait_read_deadline", env=liars)
    status = {c["name"]: c for c in report["checks"]}
    assert rc == 1 and status["wait_read_parks"]["status"] == "failed", report
    assert "answered OK while its word was short" in status["wait_read_parks"]["detail"]
    assert status["wait_read_deadline"]["status"] == "failed" and "OK" in status["wait_read_deadline"]["detail"]


def test_kit_catches_parked_reads_beyond_the_bound(liars: dict[str, str]) -> None:
    """A target that parks more waiting READs than the bound it was configured with (here: the
    config the transport named leaves the bound at 64) fails the bound check: the READs beyond it
    are parked, not refused. The honest tcp passes it (test_installed_transport_conforms)."""
    rc, report = kit("liar_wait_bound", "--check", "wait_read_bound", "--check", "wait_read_parks", env=liars)
    status = {c["name"]: c for c in report["checks"]}
    assert rc == 1 and status["wait_read_bound"]["status"] == "failed", report
    assert "not refused" in status["wait_read_bound"]["detail"]
    assert status["wait_read_parks"]["status"] == "passed", report  # the rest of it works


def test_waiting_reads_without_wait_config_run_as_configured(liars: dict[str, str]) -> None:
    """A transport that declares waiting READs but names no config for the parking bound: the kit
    runs the waiting-READ checks against the section as given (and they pass, tcp's executor is
    honest) and skips only the bound check, saying why."""
    rc, report = kit("wait_no_config", *(f"--check={c}" for c in sorted(WAIT_CHECKS)), env=liars)
    status = {c["name"]: c for c in report["checks"]}
    assert rc == 0 and set(status) == WAIT_CHECKS, report
    assert status["wait_read_bound"]["status"] == "skipped", report
    assert "Transport.wait_config" in status["wait_read_bound"]["detail"]
    assert all(status[c]["status"] == "passed" for c in WAIT_CHECKS - {"wait_read_bound"}), report
