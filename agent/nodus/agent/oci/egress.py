"""A pod's way out (`network.egress`): Deny keeps only its loopback, Open and AllowList give it a routed
veth to the node, and AllowList pins the addresses of its names in nftables inside the pod's network
namespace, where everything else is rejected and counted.

The agent (host root) writes the rules through `nsenter --net`; containers hold no CAP_NET_ADMIN
(bundle.CAPABILITIES), so the pod cannot change them. Names are resolved by the agent, never the pod,
and re-resolved every `refresh_period` on an injected clock. See docs/adr/0023-pod-egress.md.
"""
from __future__ import annotations

import enum
import ipaddress
import json
import re
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

MAX_ALLOW = 128
"""spec/job.md: `allow` holds at most 128 entries."""
POD_IF = "eth0"
DNS_PORT = 53
"""Where the pod's DNS gate (oci/dns_gate.py) listens, on the host end of the pod's link."""
TABLE = "nodus"
"""The pod's own nftables table (inet family): the `allowed` set, the `denied` counter, the output chain."""
DEFAULT_RANGE = "10.213.0.0/16"
"""Pod links' addresses when the operator names none: a /30 per id slot (16384 pods fit)."""
REFRESH_PERIOD = 60.0
"""Seconds between re-resolutions of an allow list (getaddrinfo gives no TTL, so a period stands in)."""
PRESETS: Mapping[str, tuple[str, ...]] = {
    "python-packages": ("pypi.org", "files.pythonhosted.org", "*.pythonhosted.org"),
    "huggingface": ("huggingface.co", "cdn-lfs.huggingface.co", "cdn-lfs-us-1.huggingface.co", "*.huggingface.co",
                    "*.hf.co"),
}
"""Curated host lists a Job names in `presets`; the operator's table (`preset_table`) overrides these."""
_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_NAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*\.?$")
BLOCKED = ("169.254.0.0/16",)
"""Link-local, where clouds serve instance metadata (and the node's credentials): closed to every pod."""
Resolve = Callable[[str], Iterable[str]]
"""A name to its IPv4 addresses (empty when it does not resolve)."""


class Policy(enum.Enum):
    DENY = "Deny"
    """Only the pod's own loopback: no link leaves the namespace."""
    OPEN = "Open"
    """A routed link, masqueraded: the pod reaches what the node reaches."""
    ALLOW_LIST = "AllowList"
    """The routed link, but only to the addresses the allowed names resolve to; the rest rejected and counted."""


class EgressError(ValueError):
    """A `network.egress` the agent cannot apply; the message names the field and the fix."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field_path = field_path


@dataclass(frozen=True, slots=True)
class Egress:
    """A Job's `network.egress`, validated."""

    policy: Policy = Policy.DENY
    allow: tuple[str, ...] = ()
    """DNS names, or `*.suffix` patterns, lower-case."""
    presets: tuple[str, ...] = ()

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None, presets: Mapping[str, Sequence[str]] = PRESETS) -> Egress:
        spec = spec or {}
        where = "spec.network.egress"
        raw = spec.get("policy", Policy.DENY.value)
        try:
            policy = Policy(raw)
        except ValueError:
            raise EgressError(f"{where}.policy", f"{raw!r} is not Deny, AllowList or Open") from None
        allow = tuple(str(a).strip().lower() for a in spec.get("allow") or ())
        chosen = tuple(str(p) for p in spec.get("presets") or ())
        if policy != Policy.ALLOW_LIST and (allow or chosen):
            raise EgressError(f"{where}.allow", "allow and presets apply to AllowList only; set policy: AllowList")
        if len(allow) > MAX_ALLOW:
            raise EgressError(f"{where}.allow", f"{len(allow)} entries; at most {MAX_ALLOW} (use a *.suffix pattern)")
        for i, entry in enumerate(allow):
            if not _NAME.match(entry.removeprefix("*.")):
                raise EgressError(f"{where}.allow[{i}]", f"{entry!r} is not a DNS name or a *.suffix pattern")
        for i, name in enumerate(chosen):
            if name not in presets:
                raise EgressError(f"{where}.presets[{i}]", f"{name!r} is not a preset; use one of {sorted(presets)}")
        return cls(policy, allow, chosen)

    def entries(self, presets: Mapping[str, Sequence[str]] = PRESETS) -> tuple[str, ...]:
        """The allow list with its presets expanded, each entry once, in order."""
        out = dict.fromkeys([*self.allow, *(e for p in self.presets for e in presets[p])])
        return tuple(out)

    def names(self, presets: Mapping[str, Sequence[str]] = PRESETS) -> tuple[str, ...]:
        """The entries the agent resolves: a `*.suffix` pattern names no host it could look up."""
        return tuple(e for e in self.entries(presets) if not e.startswith("*."))


def preset_table(overrides: Mapping[str, Sequence[str]] | None = None) -> dict[str, tuple[str, ...]]:
    """The built-in presets with the operator's table over them (a key there replaces the built-in one)."""
    table = {k: tuple(v) for k, v in PRESETS.items()}
    for key, entries in (overrides or {}).items():
        if isinstance(entries, str):
            raise EgressError(f"egress-presets.{key}", "must be a list of names, not one string")
        table[str(key)] = tuple(str(e).lower() for e in entries)
    return table


def matches(name: str, entries: Iterable[str]) -> bool:
    """Whether `name` is allowed by the entries (`*.suffix` matches any name below suffix, not suffix itself)."""
    name = name.lower().rstrip(".")
    return any(name == e or (e.startswith("*.") and name.endswith(e[1:])) for e in entries)


def system_resolve(name: str) -> frozenset[str]:
    """The node's resolver (its /etc/hosts, then DNS): IPv4 only, as the pod's link is IPv4."""
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return frozenset()
    return frozenset(str(info[4][0]) for info in infos)


@dataclass(frozen=True, slots=True)
class PodLink:
    """The routed veth of one pod: host end `host_if` with `host_address`, pod end eth0 with `pod_address`."""

    host_if: str
    host_address: str
    pod_address: str
    prefix: int = 30

    @classmethod
    def for_slot(cls, slot: int, pod_range: str = DEFAULT_RANGE, if_prefix: str = "nodus") -> PodLink:
        """Slot N's /30 of the agent's range: the id slot is held for the pod's life, so is the address."""
        net = ipaddress.ip_network(pod_range)
        if net.version != 4 or net.prefixlen > 30:
            raise EgressError("egress-range", f"{pod_range} must be an IPv4 network of /30 or wider")
        count = 1 << (30 - net.prefixlen)
        if slot >= count:
            raise EgressError("egress-range", f"{pod_range} holds {count} pod links and slot {slot} is past them; "
                                              f"give a wider range")
        first = int(net.network_address) + slot * 4
        host_if = f"{if_prefix}{slot}"
        if len(host_if) > 15:
            raise EgressError("egress-interface-prefix", f"{host_if!r} is longer than 15 characters; shorten it")
        return cls(host_if, str(ipaddress.IPv4Address(first + 1)), str(ipaddress.IPv4Address(first + 2)))

    def resolv_conf(self) -> str:
        """The pod's /etc/resolv.conf: its DNS gate, at the host end of its link."""
        return f"nameserver {self.host_address}\noptions timeout:2 attempts:2\n"

    @property
    def nat_table(self) -> str:
        """The node-side nftables table (ip family) that masquerades this pod; one per link, so removal is one step."""
        return "nodus_" + re.sub(r"[^A-Za-z0-9_]", "_", self.host_if)


class NetworkError(RuntimeError):
    """An `ip`, `nft` or sysctl step on the pod's network failed; the message carries the command and stderr."""


def _run(argv: Sequence[str], stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def _in(netns: str, *argv: str) -> list[str]:
    return ["nsenter", f"--net={netns}", *argv]


def pod_ruleset(policy: Policy, link: PodLink | None = None, blocked: Sequence[str] = ()) -> str:
    """The pod namespace's table. Loopback and replies pass; a new connection to a `blocked` network is refused
    and counted under every policy; Open passes the rest; AllowList passes its gate's port, `allowed` and
    `learned`, and refuses and counts the rest.

    Reject, not drop: the program fails at once instead of waiting out its timeout. TCP gets a reset, not an
    ICMP error: an ICMP error that lands while connect() holds the socket is only a soft error, so the SYN
    is retransmitted and one connect would count twice. Only TCP and UDP count (a denied datagram counts
    each time); other protocols, and packets conntrack finds invalid, are dropped uncounted.
    """
    # Only `ct state new` counts: late segments of a connection conntrack already closed are invalid, not new.
    refuse = ['ct state new meta l4proto tcp counter name "denied" reject with tcp reset',
              'ct state new meta l4proto udp counter name "denied" reject with icmpx type admin-prohibited']
    lines = ['oifname "lo" accept', "ct state established,related accept"]
    if blocked:
        nets = "ip daddr { " + ", ".join(blocked) + " }"
        lines += [f"{nets} {refuse[0]}", f"{nets} {refuse[1]}", f"{nets} drop"]
    if policy == Policy.ALLOW_LIST:
        if link is not None:
            lines.append(f"ip daddr {link.host_address} udp dport {DNS_PORT} accept")
        lines += ["ip daddr @allowed accept", "ip daddr @learned accept", *refuse]
    chain = "".join(f"    {line}\n" for line in lines)
    verdict = "drop" if policy == Policy.ALLOW_LIST else "accept"
    return (f"table inet {TABLE} {{\n"
            "  counter denied { }\n"
            "  set allowed { type ipv4_addr; }\n"
            "  set learned { type ipv4_addr; flags timeout; }\n"
            "  chain output {\n"
            f"    type filter hook output priority filter; policy {verdict};\n"
            f"{chain}"
            "  }\n"
            "}\n")


@dataclass(frozen=True, slots=True)
class NodeNetwork:
    """The agent's side of every pod's egress: where links get addresses, how names resolve, the presets."""

    pod_range: str = DEFAULT_RANGE
    """The agent's own IPv4 range; slot N's pod gets its Nth /30."""
    if_prefix: str = "nodus"
    """Host-side veth names are this plus the slot (at most 15 characters in all)."""
    uplinks: tuple[str, ...] | None = None
    """Interfaces replies come back on, whose forwarding is turned on; None turns on net.ipv4.ip_forward."""
    presets: Mapping[str, Sequence[str]] = field(default_factory=lambda: dict(PRESETS))
    resolve: Resolve = system_resolve
    clock: Callable[[], float] = time.monotonic
    refresh_period: float = REFRESH_PERIOD
    blocked: tuple[str, ...] = BLOCKED
    """Networks no pod reaches under any policy (a listed name resolving there included)."""

    @classmethod
    def from_section(cls, section: Mapping[str, Any] | None, presets: Mapping[str, Sequence[str]] | None = None) -> NodeNetwork:
        """The network spec.json's `egress_network` section describes (the agent's --egress-* settings)."""
        net = section or {}
        uplinks = net.get("uplinks")
        return cls(pod_range=net.get("pod_range") or DEFAULT_RANGE, if_prefix=net.get("if_prefix") or "nodus",
                   uplinks=None if uplinks is None else tuple(uplinks), presets=dict(presets or PRESETS))

    def for_pod(self, egress: Egress, netns: str, slot: int) -> PodEgress:
        """Not applied yet (`attach` does); a Deny pod takes no address from the range."""
        link = None if egress.policy == Policy.DENY else PodLink.for_slot(slot, self.pod_range, self.if_prefix)
        return PodEgress(egress, netns, link, self)


@dataclass(slots=True)
class PodEgress:
    """One pod's egress, applied to its network namespace (the bind-mounted file `netns`).

    `attach` is idempotent (a restarted supervisor calls it again over the same namespace, and the count
    survives); `refresh` is cheap until the period has passed; `detach` removes the link and the node's rules.
    """

    egress: Egress
    netns: str
    link: PodLink | None
    """None for Deny, and for a gang member's pod on the node's network (Open only, ADR 0033)."""
    node: NodeNetwork
    pinned: frozenset[str] = frozenset()
    """The addresses in the `allowed` set now."""
    answers: dict[str, frozenset[str]] = field(default_factory=dict)
    """Each name's last non-empty answer."""
    next_refresh: float = float("-inf")

    def attach(self) -> None:
        if self.link is None:
            return  # Deny: the namespace already has loopback only
        self._link_up(self.link)
        self._masquerade(self.link)
        if _run(_in(self.netns, "nft", "list", "table", "inet", TABLE), check=False).returncode == 0:
            self.pinned = self._set_elements()  # made before a restart: keep its rules and its count
        else:
            _run(_in(self.netns, "nft", "-f", "-"), stdin=pod_ruleset(self.egress.policy, self.link, self.node.blocked))
            self.pinned = frozenset()
        self.next_refresh = float("-inf")
        self.refresh()

    def refresh(self) -> bool:
        """Re-resolves the allowed names when due and swaps the set's contents in one transaction; True if changed."""
        now = self.node.clock()
        if self.egress.policy != Policy.ALLOW_LIST or now < self.next_refresh:
            return False
        found: set[str] = set()
        for name in self.egress.names(self.node.presets):
            answer = frozenset(a for a in self.node.resolve(name) if ipaddress.ip_address(a).version == 4)
            # A lookup that fails keeps the name's last answer: a resolver outage must not cut running work.
            self.answers[name] = answer or self.answers.get(name, frozenset())
            found |= self.answers[name]
        self.next_refresh = now + self.node.refresh_period
        if frozenset(found) == self.pinned:
            return False
        script = f"flush set inet {TABLE} allowed\n"
        if found:
            script += f"add element inet {TABLE} allowed {{ {', '.join(sorted(found))} }}\n"
        _run(_in(self.netns, "nft", "-f", "-"), stdin=script)
        self.pinned = frozenset(found)
        return True

    def denied(self) -> int:
        """Connections the pod tried and its rules refused (the `denied` counter); 0 for Deny, which has no link."""
        return denied_count(self.netns) if self.link is not None else 0

    def learn(self, addresses: Mapping[str, int]) -> None:
        """Lets the pod reach `addresses` (an address to seconds) until they expire: what the DNS gate answered
        for a name a `*.suffix` pattern allows. A second answer renews an address's time."""
        found = {a: t for a, t in addresses.items() if ipaddress.ip_address(a).version == 4}
        if self.egress.policy != Policy.ALLOW_LIST or not found:
            return
        plain = ", ".join(sorted(found))
        timed = ", ".join(f"{a} timeout {max(1, int(t))}s" for a, t in sorted(found.items()))
        # add, delete, add in one transaction: the element exists either way, with the new timeout.
        script = (f"add element inet {TABLE} learned {{ {plain} }}\n"
                  f"delete element inet {TABLE} learned {{ {plain} }}\n"
                  f"add element inet {TABLE} learned {{ {timed} }}\n")
        _run(_in(self.netns, "nft", "-f", "-"), stdin=script)

    def _set_elements(self) -> frozenset[str]:
        if self.egress.policy != Policy.ALLOW_LIST:
            return frozenset()
        done = _run(_in(self.netns, "nft", "-j", "list", "set", "inet", TABLE, "allowed"))
        for item in json.loads(done.stdout).get("nftables", []):
            if "set" in item:
                return frozenset(str(e) for e in item["set"].get("elem", []))
        return frozenset()

    def detach(self) -> None:
        """Removes the node's side (its veth, with the pod's end, and the NAT table); tolerates what is gone."""
        if self.link is not None:
            remove_link(self.link)

    def _link_up(self, link: PodLink) -> None:
        pod = self.netns
        shown = _run(_in(pod, "ip", "-j", "addr", "show", "dev", POD_IF), check=False)
        if shown.returncode == 0 and link.pod_address in shown.stdout:
            return  # made before a restart
        _run(["ip", "link", "del", link.host_if], check=False)  # a half-made one from a crash
        peer = f"{link.host_if[:13]}p"
        _run(["ip", "link", "add", link.host_if, "type", "veth", "peer", "name", peer])
        _run(["ip", "link", "set", peer, "netns", pod])
        _run(_in(pod, "ip", "link", "set", peer, "name", POD_IF))
        # IPv4 only: with IPv6 the kernel's own neighbour and router solicitations would count as denied.
        _run(_in(pod, "sysctl", "-q", "-w", f"net.ipv6.conf.{POD_IF}.disable_ipv6=1"))
        _run(_in(pod, "ip", "addr", "add", f"{link.pod_address}/{link.prefix}", "dev", POD_IF))
        _run(_in(pod, "ip", "link", "set", POD_IF, "up"))
        _run(_in(pod, "ip", "route", "add", "default", "via", link.host_address))
        _run(["ip", "addr", "add", f"{link.host_address}/{link.prefix}", "dev", link.host_if])
        _run(["ip", "link", "set", link.host_if, "up"])

    def _masquerade(self, link: PodLink) -> None:
        for name in (link.host_if, *(self.node.uplinks or ())):
            Path(f"/proc/sys/net/ipv4/conf/{name}/forwarding").write_text("1\n")
        if self.node.uplinks is None:
            Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
        script = (f"table ip {link.nat_table} {{\n"
                  "  chain postrouting {\n"
                  "    type nat hook postrouting priority srcnat; policy accept;\n"
                  f'    ip saddr {link.pod_address} oifname != "{link.host_if}" masquerade\n'
                  "  }\n"
                  "}\n")
        _run(["nft", "-f", "-"], stdin=_flush_then(script, family="ip", table=link.nat_table))


def remove_link(link: PodLink) -> None:
    """The node's side of a pod's link: its veth (with the pod's end) and its NAT table; tolerates what is gone.
    Also what a killed supervisor's pod left, found from spec.json (`left_link`)."""
    _run(["ip", "link", "del", link.host_if], check=False)
    _run(["nft", "delete", "table", "ip", link.nat_table], check=False)


def left_link(oci: Mapping[str, Any], slot: int) -> PodLink | None:
    """The link the pod of spec.json's `oci` section had at id slot `slot` (None: a Deny pod has none, and
    neither has one whose egress its supervisor refused)."""
    try:
        if Egress.from_spec(oci.get("egress")).policy == Policy.DENY:
            return None
        network = NodeNetwork.from_section(oci.get("egress_network"))
        return PodLink.for_slot(slot, network.pod_range, network.if_prefix)
    except EgressError:
        return None


def denied_count(netns: str) -> int:
    """The pod's `denied` counter (what the supervisor reports as the attempt's denied connections)."""
    done = _run(_in(netns, "nft", "-j", "list", "counter", "inet", TABLE, "denied"), check=False)
    if done.returncode != 0:
        return 0  # no table: Deny, or a pod made before egress existed
    for item in json.loads(done.stdout).get("nftables", []):
        if "counter" in item:
            return int(item["counter"].get("packets", 0))
    return 0


def _flush_then(script: str, family: str = "inet", table: str = TABLE) -> str:
    # `add` then `delete` makes the delete succeed whether or not the table existed (nft 1.0.6 has no destroy).
    return f"add table {family} {table}\ndelete table {family} {table}\n{script}"
