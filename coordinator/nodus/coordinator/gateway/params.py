"""Query parameters read the way the Kubernetes API server reads them."""
from __future__ import annotations

from collections.abc import Mapping

from ..errors import NodusError

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def query_bool(query: Mapping[str, str], name: str) -> bool:
    """`?name=` as Go's strconv.ParseBool reads it (the Python clients send `True`); absent or empty is
    false, anything else unreadable is a BadRequest naming the parameter."""
    text = query.get(name, "")
    if text in _TRUE:
        return True
    if text == "" or text in _FALSE:
        return False
    raise NodusError("BadRequest", f"the query parameter {name}={text!r} is not a boolean",
                     fix=f"pass ?{name}=true or ?{name}=false")
