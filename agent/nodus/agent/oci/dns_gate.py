"""An AllowList pod's DNS server: the one place a `*.suffix` pattern can be enforced, since no host under a
suffix is known before the pod asks for it.

The gate listens on the host end of the pod's link (the pod's resolv.conf names it; the pod's rules let
only that port through). A question for a name the allow list matches is asked of the node's resolver, and
the IPv4 addresses answered are added to the pod's `learned` set for their TTL before the answer goes back,
so the connection that follows the lookup passes. A listed name the agent already resolved is answered with
its pinned addresses, so the pod sees what the node's resolver (its /etc/hosts too) said. Any other name is
answered REFUSED and pins nothing.
Non-blocking and single-threaded: the supervisor's select loop calls `serve` when `fileno` is readable.
"""
from __future__ import annotations

import select
import socket
from typing import Callable

import dns.exception
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import dns.resolver
import dns.rrset

from .egress import DNS_PORT, PodEgress, matches

MIN_TTL = 5
"""Seconds an answered address stays pinned at least: a 0-TTL answer must outlive the connect after it."""
MAX_TTL = 3600
"""Seconds at most, so a name that moves stops opening its old address within the hour."""
MAX_DATAGRAM = 4096
Upstream = Callable[[dns.message.Message], dns.message.Message]
"""Asks the node's resolver a question; raises OSError or dns.exception.DNSException when it cannot."""


def system_upstream(timeout: float = 2.0) -> Upstream:
    """The node's nameservers from its /etc/resolv.conf, each tried in turn."""
    nameservers = list(dns.resolver.Resolver().nameservers)

    def ask(query: dns.message.Message) -> dns.message.Message:
        error: Exception = OSError("the node's /etc/resolv.conf names no nameserver")
        for server in nameservers:
            try:
                return dns.query.udp(query, str(server), timeout=timeout)
            except (OSError, dns.exception.DNSException) as e:
                error = e
        raise error

    return ask


class DnsGate:
    """The DNS server of one AllowList pod, bound to its link's host address."""

    def __init__(self, egress: PodEgress, upstream: Upstream | None = None, port: int = DNS_PORT) -> None:
        if egress.link is None:
            raise ValueError("a Deny pod has no link to serve DNS on")
        self.egress = egress
        self.entries = egress.egress.entries(egress.node.presets)
        self.upstream = upstream or system_upstream()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((egress.link.host_address, port))
        self.sock.setblocking(False)
        self.refused = 0
        """Questions for names the allow list does not match."""

    def fileno(self) -> int:
        return self.sock.fileno()

    def answer(self, wire: bytes) -> bytes | None:
        """The reply to one datagram (None for one that is not a DNS query: nothing to answer)."""
        try:
            query = dns.message.from_wire(wire)
        except dns.exception.DNSException:
            return None
        if len(query.question) != 1:
            return _reply(query, dns.rcode.FORMERR)
        name = query.question[0].name.to_text(omit_final_dot=True)
        if not matches(name, self.entries):
            self.refused += 1
            return _reply(query, dns.rcode.REFUSED)
        pinned = self.egress.answers.get(name.lower())
        if pinned:
            return _pinned_reply(query, pinned, int(self.egress.node.refresh_period))
        try:
            upstream = self.upstream(query)
        except (OSError, dns.exception.DNSException):
            return _reply(query, dns.rcode.SERVFAIL)
        learned: dict[str, int] = {}
        for rrset in upstream.answer:
            if rrset.rdtype == dns.rdatatype.A:
                for rdata in rrset:
                    learned[rdata.address] = min(max(rrset.ttl, MIN_TTL), MAX_TTL)
        self.egress.learn(learned)  # before the reply: the pod connects as soon as it has the answer
        upstream.id = query.id
        return bytes(upstream.to_wire())

    def serve(self, timeout: float = 0.0) -> int:
        """Answers every datagram waiting (after up to `timeout` seconds for the first); how many."""
        served = 0
        if not select.select([self.sock], [], [], timeout)[0]:
            return 0
        while True:
            try:
                wire, peer = self.sock.recvfrom(MAX_DATAGRAM)
            except BlockingIOError:
                return served
            reply = self.answer(wire)
            if reply is not None:
                self.sock.sendto(reply, peer)
            served += 1

    def close(self) -> None:
        self.sock.close()


def _pinned_reply(query: dns.message.Message, addresses: frozenset[str], ttl: int) -> bytes:
    """The agent's own answer for a listed name: the addresses already pinned (resolved as the node resolves, its
    /etc/hosts included), so the pod connects to what the rules let through; no AAAA, as the link is IPv4."""
    response = dns.message.make_response(query)
    question = query.question[0]
    if question.rdtype == dns.rdatatype.A:
        response.answer.append(dns.rrset.from_text_list(question.name, max(1, min(ttl, MAX_TTL)), "IN", "A",
                                                        sorted(addresses)))
    return bytes(response.to_wire())


def _reply(query: dns.message.Message, rcode: int) -> bytes:
    response = dns.message.make_response(query)
    response.set_rcode(dns.rcode.Rcode(rcode))
    return bytes(response.to_wire())
