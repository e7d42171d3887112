"""copy_json: the deep copy every write makes of its object is a real one (changing the copy never
changes what the caller or the cache holds), equal to the original, and falls back to a plain deep
copy for what JSON cannot carry."""
from __future__ import annotations

from decimal import Decimal
from typing import Any

from nodus.coordinator.api.jsondoc import copy_json


def test_the_copy_is_equal_and_shares_no_container() -> None:
    doc: dict[str, Any] = {"metadata": {"name": "j", "labels": {"a": "1"}}, "spec": {"env": [{"name": "X", "value": "y"}],
                                                                      "n": 3, "f": 0.5, "ok": True, "none": None}}
    out = copy_json(doc)
    assert out == doc
    out["metadata"]["labels"]["a"] = "2"
    out["spec"]["env"][0]["value"] = "z"
    out["spec"]["env"].append({})
    assert doc["metadata"]["labels"] == {"a": "1"} and doc["spec"]["env"] == [{"name": "X", "value": "y"}]
    assert copy_json("s") == "s" and copy_json(None) is None and copy_json([1, [2]]) == [1, [2]]


def test_what_json_cannot_carry_is_deep_copied_as_it_is() -> None:
    doc = {"amount": Decimal("1.10"), "big": 1 << 70, 1: "int key"}
    out = copy_json(doc)
    assert out == doc and out["amount"] == Decimal("1.10") and isinstance(out["amount"], Decimal)
    assert out is not doc
