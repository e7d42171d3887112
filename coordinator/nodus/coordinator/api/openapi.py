"""The OpenAPI v3 document of each group version, as `kubectl explain` and clients read it: rendered
from the same schema trees that admission validates with (admission.py), so the two cannot disagree."""
from __future__ import annotations

import copy
from typing import Any

from ..errors import NodusError
from . import units
from .admission import schema_for
from .kinds import GROUP, KindInfo, by_group_version
from .schema import FIELD_VALIDATION, Any_, Bool, Free, Int, KindSchema, List, Map, Node, Obj, Scalar, Str

__all__ = ["META", "openapi_v3", "to_openapi"]

_FORMAT_HINTS = {"duration": "duration", "quantity": "quantity", "money": "decimal", "time": "date-time",
                 "decimal": "decimal"}


def to_openapi(node: Node) -> dict[str, Any]:
    """The OpenAPI v3 (structural) schema of a node, with its description and default."""
    out: dict[str, Any] = {}
    if node.description:
        out["description"] = node.description
    if isinstance(node, Obj):
        out["type"] = "object"
        out["properties"] = {k: to_openapi(v) for k, v in node.fields.items()}
        if node.required:
            out["required"] = list(node.required)
    elif isinstance(node, List):
        out["type"] = "array"
        out["items"] = to_openapi(node.items)
        if node.max_items is not None:
            out["maxItems"] = node.max_items
        if node.min_items is not None:
            out["minItems"] = node.min_items
        if node.unique_key:
            out["x-kubernetes-list-type"] = "map"
            out["x-kubernetes-list-map-keys"] = [node.unique_key]
    elif isinstance(node, Map):
        out["type"] = "object"
        out["additionalProperties"] = to_openapi(node.values)
        if node.max_entries is not None:
            out["maxProperties"] = node.max_entries
    elif isinstance(node, Str):
        out["type"] = "string"
        if node.enum:
            out["enum"] = list(node.enum)
        if node.pattern and not node.literals:
            out["pattern"] = node.pattern
        if node.format == "money":
            out["pattern"] = units.MONEY_PATTERN
        if node.format:
            out["format"] = _FORMAT_HINTS[node.format]
        if node.min_length is not None:
            out["minLength"] = node.min_length
        if node.max_length is not None:
            out["maxLength"] = node.max_length
    elif isinstance(node, Int):
        out["type"] = "integer"
        out["format"] = "int32" if node.maximum is not None and node.maximum < 2**31 else "int64"
        if node.enum:
            out["enum"] = list(node.enum)
        if node.minimum is not None:
            out["minimum"] = node.minimum
        if node.maximum is not None:
            out["maximum"] = node.maximum
    elif isinstance(node, Bool):
        out["type"] = "boolean"
        if node.enum:
            out["enum"] = list(node.enum)
    elif isinstance(node, Free):
        out["type"] = "object"
        out["x-kubernetes-preserve-unknown-fields"] = True
    elif isinstance(node, Scalar):
        out["anyOf"] = [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]
    elif isinstance(node, Any_):
        out["x-kubernetes-preserve-unknown-fields"] = True
    if node.default is not None:
        out["default"] = copy.deepcopy(node.default)
    return out


META = "io.k8s.apimachinery.pkg.apis.meta.v1."


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _str(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def _meta_schemas() -> dict[str, dict[str, Any]]:
    """The few apimachinery schemas the kinds refer to, concise but what kubectl expects."""
    string_map = {"type": "object", "additionalProperties": {"type": "string"}}
    return {
        META + "ObjectMeta": {
            "type": "object",
            "description": "ObjectMeta is metadata that all persisted resources must have; namespace is the project.",
            "properties": {
                "name": _str("Name is unique within a project: a lowercase RFC 1123 label (at most 63 characters)."),
                "generateName": _str("GenerateName is a prefix the server completes into a unique name."),
                "namespace": _str("Namespace is the project."),
                "labels": {**string_map, "description": "Labels are key/value pairs for selecting objects."},
                "annotations": {**string_map, "description": "Annotations are unstructured key/value data."},
                "finalizers": {"type": "array", "items": {"type": "string"},
                               "description": "Finalizers must be empty before the object is deleted."},
                "ownerReferences": {"type": "array", "items": _ref(META + "OwnerReference"),
                                    "description": "OwnerReferences list the objects this one depends on."},
                "uid": _str("UID is unique in time and space; set by the server."),
                "resourceVersion": _str("ResourceVersion is an opaque version for concurrency control and watch."),
                "generation": {"type": "integer", "format": "int64",
                               "description": "Generation increases on every spec change."},
                "creationTimestamp": _str("CreationTimestamp is when the object was created (RFC 3339).",
                                          format="date-time"),
                "deletionTimestamp": _str("DeletionTimestamp is when deletion was requested (RFC 3339).",
                                          format="date-time"),
                "deletionGracePeriodSeconds": {"type": "integer", "format": "int64",
                                               "description": "Seconds allowed for graceful termination."},
                "managedFields": {"type": "array", "items": {"type": "object",
                                                             "x-kubernetes-preserve-unknown-fields": True},
                                  "description": "ManagedFields record which manager set which fields."},
                "selfLink": _str("SelfLink is deprecated and never set."),
            },
        },
        META + "OwnerReference": {
            "type": "object",
            "description": "OwnerReference identifies an owning object.",
            "required": ["apiVersion", "kind", "name", "uid"],
            "properties": {"apiVersion": _str("API version of the owner."), "kind": _str("Kind of the owner."),
                           "name": _str("Name of the owner."), "uid": _str("UID of the owner."),
                           "controller": {"type": "boolean", "description": "Controller marks the managing owner."},
                           "blockOwnerDeletion": {"type": "boolean",
                                                  "description": "BlockOwnerDeletion holds the owner's deletion."}},
        },
        META + "ListMeta": {
            "type": "object",
            "description": "ListMeta describes a list.",
            "properties": {"resourceVersion": _str("ResourceVersion to watch from."),
                           "continue": _str("Continue is the token for the next page."),
                           "remainingItemCount": {"type": "integer", "format": "int64",
                                                  "description": "Items left after this page."},
                           "selfLink": _str("SelfLink is deprecated and never set.")},
        },
        META + "StatusCause": {
            "type": "object",
            "description": "StatusCause is one field-level problem.",
            "properties": {"reason": _str("Reason is a FieldValue* reason."), "message": _str("Message explains it."),
                           "field": _str("Field is the path of the field, for example spec.completions.")},
        },
        META + "StatusDetails": {
            "type": "object",
            "description": "StatusDetails names the object and the causes.",
            "properties": {"name": _str("Name of the object."), "group": _str("Group of the object."),
                           "kind": _str("Kind (plural) of the object."), "uid": _str("UID of the object."),
                           "causes": {"type": "array", "items": _ref(META + "StatusCause"),
                                      "description": "Causes are the field-level problems."},
                           "retryAfterSeconds": {"type": "integer", "format": "int32",
                                                 "description": "Seconds to wait before retrying."}},
        },
        META + "Status": {
            "type": "object",
            "description": "Status is the error body of every API response: a metav1.Status plus docs, fix and "
                           "requestId, which Kubernetes clients ignore.",
            "properties": {
                "apiVersion": _str("APIVersion is v1."), "kind": _str("Kind is Status."),
                "metadata": _ref(META + "ListMeta"),
                "status": _str("Status is Success or Failure."), "message": _str("Message describes the error."),
                "reason": _str("Reason is a registered error code."),
                "details": _ref(META + "StatusDetails"),
                "code": {"type": "integer", "format": "int32", "description": "Code is the HTTP status."},
                "docs": _str("Docs is the URL of the code's docs page."),
                "fix": _str("Fix says what to do next, for example a CLI command or the field to change."),
                "requestId": _str("RequestID identifies the request in logs and support tickets."),
            },
            "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "Status"}],
        },
        META + "WatchEvent": {
            "type": "object",
            "description": "WatchEvent is one line of a watch stream.",
            "required": ["type", "object"],
            "properties": {"type": _str("Type is ADDED, MODIFIED, DELETED, BOOKMARK or ERROR."),
                           "object": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                                      "description": "Object is the object, or a Status for ERROR."}},
        },
        META + "DeleteOptions": {
            "type": "object",
            "description": "DeleteOptions may be sent with a DELETE.",
            "properties": {"apiVersion": _str("APIVersion."), "kind": _str("Kind is DeleteOptions."),
                           "propagationPolicy": _str("PropagationPolicy is Orphan, Background or Foreground."),
                           "gracePeriodSeconds": {"type": "integer", "format": "int64",
                                                  "description": "Seconds before the object is deleted."},
                           "dryRun": {"type": "array", "items": {"type": "string"},
                                      "description": "DryRun: All validates without deleting."}},
        },
    }


def _query(name: str, description: str, type_: str = "string") -> dict[str, Any]:
    return {"name": name, "in": "query", "description": description, "schema": {"type": type_},
            "required": False}


_LIST_PARAMS = [
    _query("watch", "Watch streams add, update and delete events instead of listing.", "boolean"),
    _query("labelSelector", "A selector over labels."),
    _query("fieldSelector", "A selector over fields: metadata.name, metadata.namespace, status.phase."),
    _query("limit", "The most items to return; continue with the continue token.", "integer"),
    _query("continue", "The continue token of the previous page."),
    _query("resourceVersion", "List or watch from this resourceVersion."),
    _query("resourceVersionMatch", "How resourceVersion applies to a list (NotOlderThan, Exact)."),
    _query("timeoutSeconds", "Ends a watch after this many seconds.", "integer"),
    _query("allowWatchBookmarks", "Asks for BOOKMARK events.", "boolean"),
    _query("sendInitialEvents", "Starts a watch with ADDED events for the current objects.", "boolean"),
]
_DRY_RUN = _query("dryRun", "All: validate, default and estimate without persisting.")
_FIELD_MANAGER = _query("fieldManager", "The name of the actor making the change.")
_FIELD_VALIDATION = {**_query("fieldValidation", "Unknown fields: Strict (the default) refuses them, Warn drops them "
                                                  "with a warning, Ignore drops them."),
                     "schema": {"type": "string", "enum": list(FIELD_VALIDATION)}}
_WRITE_PARAMS = [_DRY_RUN, _FIELD_MANAGER, _FIELD_VALIDATION]


def _json(schema: dict[str, Any], *types: str) -> dict[str, Any]:
    return {t: {"schema": schema} for t in (types or ("application/json",))}


def _responses(ok: dict[str, Any], *codes: str) -> dict[str, Any]:
    out = {code: {"description": "OK" if code == "200" else "Created" if code == "201" else "Accepted",
                  "content": _json(ok)} for code in (codes or ("200",))}
    out["default"] = {"description": "An error: a metav1.Status whose reason is a registered code.",
                      "content": _json(_ref(META + "Status"))}
    return out


def _operation(op_id: str, action: str, gvk: dict[str, str], description: str, responses: dict[str, Any],
               params: list[dict[str, Any]] | None = None, body: dict[str, Any] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": op_id, "description": description, "tags": [gvk["group"] + "_" + gvk["version"]],
                          "responses": responses, "x-kubernetes-action": action,
                          "x-kubernetes-group-version-kind": dict(gvk)}
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {"required": True, "content": body}
    return op


def _paths(info: KindInfo, name: str) -> dict[str, Any]:
    gvk = {"group": info.group, "version": info.version, "kind": info.kind}
    obj, lst = _ref(name), _ref(name + "List")
    stem = "NodusDev" + info.version[0].upper() + info.version[1:]
    base = f"/apis/{info.group}/{info.version}"
    collection = f"{base}/namespaces/{{namespace}}/{info.plural}"
    namespace = {"name": "namespace", "in": "path", "required": True, "description": "The project.",
                 "schema": {"type": "string"}}
    object_name = {"name": "name", "in": "path", "required": True, "description": "The object's name.",
                   "schema": {"type": "string"}}
    list_responses = _responses(lst)
    list_responses["200"]["content"]["application/json;stream=watch"] = {"schema": _ref(META + "WatchEvent")}
    patch_body = {t: {"schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
                  for t in ("application/merge-patch+json", "application/json-patch+json")}
    patch_body["application/json-patch+json"] = {"schema": {"type": "array", "items": {"type": "object"}}}

    def read_write(suffix: str, what: str) -> dict[str, Any]:
        return {
            "parameters": [namespace, object_name],
            "get": _operation(f"read{stem}Namespaced{info.kind}{suffix}", "get", gvk, f"Read {what}.",
                              _responses(obj)),
            "put": _operation(f"replace{stem}Namespaced{info.kind}{suffix}", "put", gvk, f"Replace {what}.",
                              _responses(obj, "200", "201"), _WRITE_PARAMS, _json(obj)),
            "patch": _operation(f"patch{stem}Namespaced{info.kind}{suffix}", "patch", gvk,
                                f"Partially update {what} (merge patch or JSON patch).",
                                _responses(obj, "200", "201"), [*_WRITE_PARAMS, _query("force", "Unused.", "boolean")],
                                patch_body),
        }

    item = read_write("", f"the {info.kind}")
    item["delete"] = _operation(f"delete{stem}Namespaced{info.kind}", "delete", gvk,
                                f"Delete the {info.kind}; it is gone once its finalizers are done.",
                                _responses(obj, "200", "202"), [_DRY_RUN], _json(_ref(META + "DeleteOptions")))
    item["delete"]["requestBody"]["required"] = False
    return {
        collection: {
            "parameters": [namespace],
            "get": _operation(f"list{stem}Namespaced{info.kind}", "list", gvk,
                              f"List or watch {info.plural} in the project.", list_responses, _LIST_PARAMS),
            "post": _operation(f"create{stem}Namespaced{info.kind}", "post", gvk, f"Create a {info.kind}.",
                               _responses(obj, "200", "201", "202"), _WRITE_PARAMS, _json(obj)),
        },
        f"{collection}/{{name}}": item,
        f"{collection}/{{name}}/status": read_write("Status", f"the status of the {info.kind}"),
        f"{base}/{info.plural}": {
            "get": _operation(f"list{stem}{info.kind}ForAllNamespaces", "list", gvk,
                              f"List or watch {info.plural} in every project the caller may read.", list_responses,
                              _LIST_PARAMS),
        },
    }


def _kind_schema(info: KindInfo, ks: KindSchema) -> dict[str, Any]:
    props: dict[str, Any] = {
        "apiVersion": _str(f"APIVersion is {info.api_version}."),
        "kind": _str(f"Kind is {info.kind}."),
        "metadata": {"allOf": [_ref(META + "ObjectMeta")], "description": "Standard object metadata; namespace is "
                                                                          "the project."},
    }
    props.update(to_openapi(ks.body)["properties"])
    props["status"] = to_openapi(ks.status)
    return {"type": "object", "description": ks.description, "properties": props,
            "x-kubernetes-group-version-kind": [{"group": info.group, "version": info.version, "kind": info.kind}]}


def openapi_v3(group_version: str) -> dict[str, Any]:
    """The OpenAPI 3.0 document for one group version, as `kubectl explain` reads it."""
    infos = by_group_version(group_version)
    if not infos:
        raise NodusError("NotFound", f'no group version "{group_version}"',
                         fix=f"use {GROUP}/v1 or {GROUP}/v1beta1")
    schemas = _meta_schemas()
    paths: dict[str, Any] = {}
    for info in infos:
        name = f"dev.nodus.{info.version}.{info.kind}"
        schemas[name] = _kind_schema(info, schema_for(info))
        schemas[name + "List"] = {
            "type": "object",
            "description": f"{info.kind}List is a list of {info.kind} objects.",
            "required": ["items"],
            "properties": {"apiVersion": _str(f"APIVersion is {info.api_version}."),
                           "kind": _str(f"Kind is {info.kind}List."),
                           "metadata": {"allOf": [_ref(META + "ListMeta")], "description": "Standard list metadata."},
                           "items": {"type": "array", "items": _ref(name), "description": f"Items are the {info.plural}."}},
            "x-kubernetes-group-version-kind": [{"group": info.group, "version": info.version,
                                                 "kind": info.kind + "List"}],
        }
        paths.update(_paths(info, name))
    return {"openapi": "3.0.0", "info": {"title": "Nodus", "version": group_version},
            "paths": paths, "components": {"schemas": schemas}}
