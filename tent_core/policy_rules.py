"""Administrator policy rules: which transports and rails a class of requests may use.

Rules live in the engine config, evaluated in order; the first rule whose match fits a
request decides (like a firewall). A rule restricts and/or orders transports and restricts
rails; a request that no transport/rail survives fails with PolicyRejectedError, never
silently. Example (TOML)::

    [[rules]]
    name = "kv-fast-rails"
    match = { priority = "HIGH", tag = "kv" }
    rails = [0, 1]                      # rail indices of the chosen transport

    [[rules]]
    name = "no-tcp-for-ckpt"
    match = { tag = "checkpoint" }
    deny_transports = ["tcp"]

    [[rules]]
    match = { min_size = 1048576, same_host = true }
    transports = ["shm", "tcp"]        # allowed, in this order of preference
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .types import MemoryKind, Priority

_MATCH_KEYS = {"priority", "min_size", "max_size", "local_kind", "remote_kind", "same_host", "tag"}
_RULE_KEYS = {"name", "match", "transports", "deny_transports", "rails"}


@dataclass(frozen=True)
class RequestTraits:
    priority: Priority
    size: int
    local_kind: MemoryKind
    remote_kind: MemoryKind
    same_host: bool
    tag: str | None


@dataclass(frozen=True)
class Rule:
    name: str
    priorities: frozenset[Priority] | None = None
    min_size: int | None = None
    max_size: int | None = None
    local_kinds: frozenset[MemoryKind] | None = None
    remote_kinds: frozenset[MemoryKind] | None = None
    same_host: bool | None = None
    tags: frozenset[str] | None = None
    transports: tuple[str, ...] | None = None  # allowed, in preference order
    deny_transports: frozenset[str] = frozenset()
    rails: frozenset[int] | None = None

    def matches(self, t: RequestTraits) -> bool:
        return (
            (self.priorities is None or t.priority in self.priorities)
            and (self.min_size is None or t.size >= self.min_size)
            and (self.max_size is None or t.size <= self.max_size)
            and (self.local_kinds is None or t.local_kind in self.local_kinds)
            and (self.remote_kinds is None or t.remote_kind in self.remote_kinds)
            and (self.same_host is None or t.same_host == self.same_host)
            and (self.tags is None or (t.tag is not None and t.tag in self.tags))
        )

    def filter_transports(self, ranked: Sequence[str]) -> list[str]:
        out = [n for n in ranked if n not in self.deny_transports]
        if self.transports is not None:
            out = [n for n in self.transports if n in out]
        return out

    def filter_rails(self, indices: Sequence[int]) -> list[int]:
        return list(indices) if self.rails is None else [i for i in indices if i in self.rails]


def _set(value: Any, conv: Any, what: str) -> frozenset[Any]:
    items = value if isinstance(value, (list, tuple, set, frozenset)) else [value]
    try:
        return frozenset(conv(v) for v in items)
    except (KeyError, ValueError) as exc:
        raise ValueError(f"rule {what}: bad value {value!r}") from exc


def _prio(v: Any) -> Priority:
    return Priority[v.upper()] if isinstance(v, str) else Priority(int(v))


def parse_rules(raw: Sequence[Mapping[str, Any]]) -> list[Rule]:
    """Validate rules from the config; errors name the rule and the key."""
    rules: list[Rule] = []
    for i, r in enumerate(raw):
        if not isinstance(r, Mapping):
            raise ValueError(f"rule #{i}: expected a table, got {type(r).__name__}")
        name = str(r.get("name", f"rule-{i}"))
        unknown = set(r) - _RULE_KEYS
        if unknown:
            raise ValueError(f"rule {name!r}: unknown keys {sorted(unknown)} (allowed: {sorted(_RULE_KEYS)})")
        m = r.get("match", {})
        if not isinstance(m, Mapping):
            raise ValueError(f"rule {name!r}: 'match' must be a table")
        bad = set(m) - _MATCH_KEYS
        if bad:
            raise ValueError(f"rule {name!r}: unknown match keys {sorted(bad)} (allowed: {sorted(_MATCH_KEYS)})")
        rules.append(
            Rule(
                name=name,
                priorities=_set(m["priority"], _prio, f"{name}.priority") if "priority" in m else None,
                min_size=int(m["min_size"]) if "min_size" in m else None,
                max_size=int(m["max_size"]) if "max_size" in m else None,
                local_kinds=_set(m["local_kind"], MemoryKind, f"{name}.local_kind") if "local_kind" in m else None,
                remote_kinds=_set(m["remote_kind"], MemoryKind, f"{name}.remote_kind") if "remote_kind" in m else None,
                same_host=bool(m["same_host"]) if "same_host" in m else None,
                tags=_set(m["tag"], str, f"{name}.tag") if "tag" in m else None,
                transports=tuple(str(x) for x in r["transports"]) if "transports" in r else None,
                deny_transports=_set(r.get("deny_transports", []), str, f"{name}.deny_transports"),
                rails=_set(r["rails"], int, f"{name}.rails") if "rails" in r else None,
            )
        )
    return rules


def first_match(rules: Sequence[Rule], traits: RequestTraits) -> Rule | None:
    for rule in rules:
        if rule.matches(traits):
            return rule
    return None
