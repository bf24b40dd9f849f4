"""Transports publish their config keys with defaults; the engine refuses keys nobody declared."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from tent_core import Engine
from tent_core.errors import ConfigError
from tent_core.plugin_manager import discover, instantiate
from tent_core.transport import CORE_CONFIG_KEYS, resolve_config

KEYS = {"threads": 2, "mode": "auto", "direct": False, "timeout": 5.0, "lib": None}


def test_defaults_overlaid_and_values_converted() -> None:
    cfg = resolve_config("demo", KEYS, {"threads": "8", "direct": "yes", "timeout": 1, "lib": ["a", "b"]})
    assert cfg == {**CORE_CONFIG_KEYS, **KEYS, "threads": 8, "direct": True, "timeout": 1.0, "lib": ["a", "b"]}
    assert resolve_config("demo", KEYS, None) == {**CORE_CONFIG_KEYS, **KEYS}
    assert resolve_config("demo", KEYS, {"slice_timeout_ms": 100})["slice_timeout_ms"] == 100


def test_unknown_key_names_itself_and_the_known_ones() -> None:
    with pytest.raises(ConfigError) as exc:
        resolve_config("demo", KEYS, {"thread": 4, "mod": "x"})
    msg = str(exc.value)
    assert "transports.demo" in msg and "'mod', 'thread'" in msg
    assert all(k in msg for k in (*KEYS, *CORE_CONFIG_KEYS))


def test_bad_value_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"transports\.demo\.threads"):
        resolve_config("demo", KEYS, {"threads": "many"})


def test_every_installed_transport_publishes_its_keys() -> None:
    for name, entry in discover().registry.entries.items():
        transport, _ = instantiate(entry)
        assert transport is not None, name
        assert transport.config_keys, f"{name} publishes no config keys"
        assert not set(transport.config_keys) & set(CORE_CONFIG_KEYS), name


@pytest.mark.parametrize("name,key", [("tcp", "conns_per_rial"), ("shm", "threds"), ("nvlink", "stream")])
def test_engine_refuses_a_typo_and_leaks_nothing(name: str, key: str) -> None:
    """nvlink is unavailable without CUDA: its section is still checked."""
    if name not in discover().registry.entries:
        pytest.skip(f"{name} not installed")
    before = threading.active_count()
    with pytest.raises(ConfigError, match=rf"transports\.{name}: unknown config key '{key}'"):
        Engine({"transports": {name: {key: 1}}})
    assert threading.active_count() == before
    with Engine({"transports": {name: {}}}) as eng:  # a clean section still works
        assert eng.transports


def test_tent_plugins_shows_the_keys() -> None:
    out = subprocess.run([sys.executable, "-m", "tent_core.cli", "plugins", "--json"], capture_output=True, text=True,
                         timeout=60, check=True)  # fmt: skip
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert rows["tcp"]["config_keys"]["conns_per_rail"] == 4
    assert rows["shm"]["config_keys"]["mode"] == "memfd"  # CMA is opt-in (SECURITY.md)
