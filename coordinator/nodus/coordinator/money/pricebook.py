"""The operator's price book: a YAML document parsed into frozen values, every field checked.

    pricebookVersion: "2026-12-01"
    storageUSDPerGiBMonth: "0.08"
    offerings:
      - id: h100-sxm-80g-x8-us
        accelerator: {id: nvidia-h100-sxm-80g, family: H100, gpusPerNode: 8, memory: 80Gi, interconnect: NVLink}
        vcpu: 208
        memory: 1800Gi
        disk: 20Ti
        regionClass: us
        provider: lambda
        region: us-east-1
        rateUSDPerHour: "23.92"
        interruptible: false
        billingIncrement: 60s
        minimumCharge: 5m
        relativeSpeed: "1"

Pure: `parse` takes the loaded document and returns a `PriceBook` or raises one `Invalid` error whose
causes name every bad field by its path (`offerings[2].rateUSDPerHour`) with the fix. Money is a
quoted decimal string: YAML reads `2.50` as a float, which is refused, never rounded.
"""
from __future__ import annotations

import enum
import hashlib
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable, Mapping, TypeVar

import orjson

from ..api import units
from ..errors import Cause, NodusError, duplicate, invalid, invalid_value, not_supported, required, unknown_field

KIND = "PriceBook"
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_ID = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
MONEY_HINT = 'must be a decimal string like "2.50" (quoted: YAML reads an unquoted 2.50 as a float)'
MAX_GPUS_PER_NODE = 16
MAX_BILLING_INCREMENT_S = 3600
MAX_MINIMUM_CHARGE_S = 86400


class Interconnect(enum.Enum):
    """How the GPUs of one node talk to each other."""

    NVLINK = "NVLink"
    """NVLink / NVSwitch between every GPU of the node."""
    PCIE = "PCIe"
    """Only the PCIe bus (and the host) between GPUs."""


@dataclass(frozen=True, slots=True)
class Accelerator:
    """The GPUs of an offering's node."""

    id: str
    """The exact variant, for example nvidia-h100-sxm-80g."""
    family: str
    """The family a Job's resources.gpu.type names, for example H100 (matches every H100 variant)."""
    gpus_per_node: int
    memory_bytes: int
    """Per GPU, as sold (80Gi); a measured GPU may report a little less (see fit.py)."""
    interconnect: Interconnect


@dataclass(frozen=True, slots=True)
class Offering:
    """One kind of node a customer can rent, and its price."""

    id: str
    accelerator: Accelerator | None
    """None for a CPU-only offering."""
    vcpus: int
    memory_bytes: int
    disk_bytes: int
    region_class: str
    provider: str
    region: str
    rate_usd_per_hour: Decimal
    """The customer's rate for the whole node."""
    interruptible: bool
    interruptions_per_hour: Decimal
    """Expected reclaims per hour of running (0 for capacity that is never reclaimed)."""
    billing_increment_s: int
    """Charges post per started increment of this many seconds."""
    minimum_charge_s: int
    """Each allocation is charged at least this many seconds."""
    relative_speed: Decimal
    """Speed of one accelerator (of the node, when CPU-only) against the reference, so Speed can rank."""

    @property
    def gpus(self) -> int:
        return self.accelerator.gpus_per_node if self.accelerator else 0


@dataclass(frozen=True, slots=True)
class PriceBook:
    version: str
    offerings: tuple[Offering, ...]
    storage_usd_per_gib_month: Decimal
    """Checkpoints and outputs above the free inclusion are charged at this rate."""
    by_id: Mapping[str, Offering] = field(init=False, repr=False, compare=False)
    """The offerings by id (placement looks one up per node it fits)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_id", {o.id: o for o in self.offerings})

    def offering(self, offering_id: str) -> Offering | None:
        return self.by_id.get(offering_id)

    @property
    def digest(self) -> str:
        """sha256 of the book's values, so "2.5" and "2.50" or 80Gi and its bytes are the same content."""
        return hashlib.sha256(orjson.dumps(canonical(self), option=orjson.OPT_SORT_KEYS)).hexdigest()


def canonical(book: PriceBook) -> dict[str, Any]:
    """The book's values as plain JSON (decimals normalized), the form its digest is taken of."""
    def dec(d: Decimal) -> str:
        return format(d.normalize(), "f")

    def offering(o: Offering) -> dict[str, Any]:
        acc = o.accelerator
        return {
            "id": o.id, "vcpu": o.vcpus, "memoryBytes": o.memory_bytes, "diskBytes": o.disk_bytes,
            "accelerator": None if acc is None else {
                "id": acc.id, "family": acc.family, "gpusPerNode": acc.gpus_per_node,
                "memoryBytes": acc.memory_bytes, "interconnect": acc.interconnect.value},
            "regionClass": o.region_class, "provider": o.provider, "region": o.region,
            "rateUSDPerHour": dec(o.rate_usd_per_hour), "interruptible": o.interruptible,
            "interruptionsPerHour": dec(o.interruptions_per_hour), "billingIncrementSeconds": o.billing_increment_s,
            "minimumChargeSeconds": o.minimum_charge_s, "relativeSpeed": dec(o.relative_speed)}
    return {"pricebookVersion": book.version, "storageUSDPerGiBMonth": dec(book.storage_usd_per_gib_month),
            "offerings": [offering(o) for o in book.offerings]}


# -- parsing -------------------------------------------------------------------------------------------

T = TypeVar("T")
_MISSING: Any = object()


class _Fields:
    """Reads one mapping's fields, collecting a cause per problem instead of stopping at the first."""

    def __init__(self, doc: dict[str, Any], path: str, causes: list[Cause], known: tuple[str, ...]) -> None:
        self.doc, self.path, self.causes = doc, path, causes
        for key in doc:
            if key not in known:
                causes.append(unknown_field(self.at(str(key))))

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, read: Callable[[str, Any], T], default: Any = _MISSING) -> T | None:
        if key not in self.doc or self.doc[key] is None:
            if default is _MISSING:
                self.causes.append(required(self.at(key)))
                return None
            return read(self.at(key), default) if default is not None else None
        try:
            return read(self.at(key), self.doc[key])
        except ValueError as e:
            self.causes.append(invalid_value(self.at(key), self.doc[key], str(e)))
            return None


def _text(pattern: re.Pattern[str] | None, hint: str) -> Callable[[str, Any], str]:
    def read(path: str, value: Any) -> str:
        if not isinstance(value, str) or not value or (pattern is not None and not pattern.match(value)):
            raise ValueError(hint)
        return value
    return read


def _int(low: int, high: int) -> Callable[[str, Any], int]:
    def read(path: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"must be a whole number from {low} to {high}")
        return value
    return read


def _bytes(positive: bool) -> Callable[[str, Any], int]:
    def read(path: str, value: Any) -> int:
        q = units.parse_quantity(value)
        if q != q.to_integral_value() or q < (1 if positive else 0):
            raise ValueError("must be a whole number of bytes" + (" above 0" if positive else "")
                             + ', such as "80Gi"')
        return int(q)
    return read


def _money(path: str, value: Any) -> Decimal:
    if not isinstance(value, str) or re.fullmatch(units.MONEY_PATTERN, value) is None:
        raise ValueError(MONEY_HINT)
    return Decimal(value)


def _fraction(positive: bool) -> Callable[[str, Any], Decimal]:
    def read(path: str, value: Any) -> Decimal:
        if not isinstance(value, str):
            raise ValueError('must be a quoted decimal string such as "0.05"')
        d = units.parse_decimal(value)
        if d < 0 or (positive and d == 0):
            raise ValueError("must be above 0" if positive else "must not be negative")
        return d
    return read


def _seconds(high: int, positive: bool) -> Callable[[str, Any], int]:
    def read(path: str, value: Any) -> int:
        if not isinstance(value, str):
            raise ValueError(units.DURATION_HINT)
        ns = units.parse_duration_ns(value)
        if ns % units.NS_PER_SECOND or not (1 if positive else 0) <= ns // units.NS_PER_SECOND <= high:
            raise ValueError(f"must be whole seconds from {1 if positive else 0}s to {high}s")
        return ns // units.NS_PER_SECOND
    return read


def _bool(path: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def _mapping(value: Any, path: str, causes: list[Cause]) -> dict[str, Any] | None:
    if isinstance(value, dict):
        return value
    causes.append(invalid_value(path or "document", value, "must be a mapping"))
    return None


_ACCELERATOR_FIELDS = ("id", "family", "gpusPerNode", "memory", "interconnect")
_OFFERING_FIELDS = ("id", "accelerator", "vcpu", "memory", "disk", "regionClass", "provider", "region",
                    "rateUSDPerHour", "interruptible", "interruptionsPerHour", "billingIncrement", "minimumCharge",
                    "relativeSpeed")
_BOOK_FIELDS = ("pricebookVersion", "storageUSDPerGiBMonth", "offerings")


def _accelerator(value: Any, path: str, causes: list[Cause]) -> Accelerator | None:
    doc = _mapping(value, path, causes)
    if doc is None:
        return None
    f = _Fields(doc, path, causes, _ACCELERATOR_FIELDS)
    before = len(causes)
    acc_id = f.get("id", _text(_ID, "must be lowercase letters, digits and '-', such as nvidia-h100-sxm-80g"))
    family = f.get("family", _text(re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,31}$"),
                                   "must name a GPU family such as H100, A100 or L4"))
    gpus = f.get("gpusPerNode", _int(1, MAX_GPUS_PER_NODE))
    memory = f.get("memory", _bytes(True))
    interconnect = doc.get("interconnect", Interconnect.PCIE.value)
    choices = tuple(i.value for i in Interconnect)
    if interconnect not in choices:
        causes.append(not_supported(f.at("interconnect"), interconnect, choices))
    if len(causes) > before:
        return None
    assert acc_id is not None and family is not None and gpus is not None and memory is not None
    return Accelerator(acc_id, family, gpus, memory, Interconnect(interconnect))


def _offering(value: Any, path: str, causes: list[Cause]) -> Offering | None:
    doc = _mapping(value, path, causes)
    if doc is None:
        return None
    f = _Fields(doc, path, causes, _OFFERING_FIELDS)
    before = len(causes)
    offering_id = f.get("id", _text(_ID, "must be lowercase letters, digits and '-' (at most 63), such as "
                                         "h100-sxm-80g-x8-us"))
    accelerator = None if doc.get("accelerator") is None else _accelerator(doc["accelerator"], f.at("accelerator"),
                                                                           causes)
    vcpus = f.get("vcpu", _int(1, 4096))
    memory = f.get("memory", _bytes(True))
    disk = f.get("disk", _bytes(False), default=0)
    region_class = f.get("regionClass", _text(re.compile(r"^[a-z][a-z0-9-]{0,31}$"),
                                              "must be a lowercase region class such as us or eu"))
    provider = f.get("provider", _text(None, "must name the provider, such as lambda or aws"))
    region = f.get("region", _text(None, "must name the provider's region, such as us-east-1"))
    rate = f.get("rateUSDPerHour", _money)
    interruptible = f.get("interruptible", _bool, default=False)
    interruptions = f.get("interruptionsPerHour", _fraction(False), default="0")
    increment = f.get("billingIncrement", _seconds(MAX_BILLING_INCREMENT_S, True))
    minimum = f.get("minimumCharge", _seconds(MAX_MINIMUM_CHARGE_S, False), default="0s")
    speed = f.get("relativeSpeed", _fraction(True), default="1")
    if interruptible and interruptions is not None and interruptions == 0:
        causes.append(invalid_value(f.at("interruptionsPerHour"), doc.get("interruptionsPerHour", "0"),
                                    "an interruptible offering is reclaimed now and then: set the expected "
                                    'reclaims per hour above 0, such as "0.05"'))
    if interruptible is False and interruptions:
        causes.append(invalid_value(f.at("interruptionsPerHour"), doc["interruptionsPerHour"],
                                    "only an interruptible offering expects interruptions: set interruptible: true, "
                                    'or "0"'))
    if len(causes) > before:
        return None
    assert offering_id and vcpus and memory and region_class and provider and region and rate is not None
    assert interruptible is not None and interruptions is not None and increment and minimum is not None and speed
    return Offering(offering_id, accelerator, vcpus, memory, disk or 0, region_class, provider, region, rate,
                    interruptible, interruptions, increment, minimum, speed)


def parse(document: Any) -> PriceBook:
    """The price book in `document` (as yaml.safe_load gives it), or NodusError("Invalid") naming every
    bad field."""
    causes: list[Cause] = []
    doc = _mapping(document, "", causes)
    if doc is None:
        raise invalid(KIND, "", causes, fix="send a YAML mapping with pricebookVersion, storageUSDPerGiBMonth "
                                             "and offerings (see examples/pricebook.yaml)")
    f = _Fields(doc, "", causes, _BOOK_FIELDS)
    version = f.get("pricebookVersion", _text(_VERSION, 'must be letters, digits, ".", "_" or "-" (at most 63), '
                                                        'such as "2026-12-01"'))
    storage = f.get("storageUSDPerGiBMonth", _money)
    offerings: list[Offering] = []
    raw = doc.get("offerings")
    if raw is None:
        causes.append(required("offerings", "list at least one offering"))
    elif not isinstance(raw, list) or not raw:
        causes.append(invalid_value("offerings", raw, "must be a list of at least one offering"))
    else:
        seen: set[str] = set()
        for i, item in enumerate(raw):
            offering = _offering(item, f"offerings[{i}]", causes)
            item_id = item.get("id") if isinstance(item, dict) else None
            if isinstance(item_id, str) and item_id in seen:
                causes.append(duplicate(f"offerings[{i}].id", item_id))
            elif isinstance(item_id, str):
                seen.add(item_id)
            if offering is not None:
                offerings.append(offering)
    if causes:
        raise invalid(KIND, version or "", causes)
    assert version is not None and storage is not None
    return PriceBook(version, tuple(offerings), storage)


def no_price_book() -> NodusError:
    return NodusError("NotFound", "no price book is active: this coordinator charges nothing and refuses nothing "
                      "for money", kind="pricebooks",
                      fix="apply one with `nodus pricebook apply -f FILE` (or start with --price-book FILE)")
