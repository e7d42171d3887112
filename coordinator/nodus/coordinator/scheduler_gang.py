"""Gang placement: all of a gang's members at once, one per node, within one locality (`place_gang`),
on top of the single-attempt decisions of scheduler.py."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from .money.pricebook import PriceBook
from .scheduler import Candidate, Key, NodeView, Placement, Request, Reservation, Scorer, fit, place, spread

PROVIDER_LABELS = ("nodus.dev/provider", "provider")


def provider_of(node: NodeView) -> str:
    return next((node.labels[k] for k in PROVIDER_LABELS if node.labels.get(k)), "")


def localities(nodes: Sequence[NodeView], network: str) -> list[tuple[str, list[NodeView]]]:
    """The node groups a gang may span: Global, one group; Regional, one per region class;
    Colocated, one per provider and region."""
    if network == "Global":
        return [("anywhere", list(nodes))]
    groups: dict[str, list[NodeView]] = {}
    for node in nodes:
        if network == "Regional":
            key = node.region or "no region"
        else:
            key = f"{provider_of(node) or 'no provider'}/{node.region or 'no region'}"
        groups.setdefault(key, []).append(node)
    return sorted(groups.items())


def place_gang(requests: Sequence[tuple[Key, Request]], nodes: Sequence[NodeView],
               reservations: Sequence[Reservation], network: str = "Regional",
               scorer: Scorer = spread, book: PriceBook | None = None) -> dict[Key, Placement]:
    """All or nothing: every member (in rank order) on a node of its own, all within one locality
    (`network`), a rank on its previous node when that still fits; else none is placed and each
    says why. Deterministic: localities are tried by the most preferred nodes they hold, then by name."""
    size = len(requests)
    preferred = {r.prefer_node for _, r in requests if r.prefer_node}
    groups = localities(nodes, network)
    groups.sort(key=lambda g: -sum(1 for n in g[1] if n.name in preferred))
    why: list[str] = []
    for label, group in groups:
        held = list(reservations)
        used: set[str] = set()
        out: dict[Key, Placement] = {}
        for rank, (key, request) in enumerate(requests):
            free = [n for n in group if n.name not in used]
            placement = None
            if request.prefer_node:
                mine = [n for n in free if n.name == request.prefer_node]
                if mine and isinstance(fit(request, mine[0], held, book), Candidate):
                    placement = place(request, mine, held, scorer, book)
                    placement = replace(placement, explain=f"{placement.node}: rank {rank} keeps its node")
            if placement is None:
                placement = place(request, free, held, scorer, book)
            if placement.node is None:
                where = "" if network == "Global" else f" in {label}"
                why.append(f"{label}: rank {rank} fits no free node{where} ({placement.explain})"
                           if free else f"{label}: only {len(group)} nodes for {size} ranks")
                break
            used.add(placement.node)
            held.append(Reservation(placement.node, request.amount, placement.gpu_indexes))
            out[key] = replace(placement,
                               explain=f"{placement.explain}; gang of {size} placed all at once ({network})")
        else:
            return out
    if any(r.avoid_nodes for _, r in requests):
        # Avoiding where a rank failed to assemble is a preference: better there again than nowhere.
        again = place_gang([(k, replace(r, avoid_nodes=())) for k, r in requests], nodes, reservations, network,
                           scorer, book)
        if again and all(p.node for p in again.values()):
            return again
    if not nodes:
        reason = "no node has registered"
    else:
        shown = "; ".join(why[:4]) + (f"; and {len(why) - 4} more" if len(why) > 4 else "")
        reason = f"a gang of {size} needs {size} nodes at once within one {_LOCALITY.get(network, network)}: {shown}"
    return {key: Placement(None, explain=reason) for key, _ in requests}


_LOCALITY = {"Global": "network", "Regional": "region class", "Colocated": "provider and region"}
