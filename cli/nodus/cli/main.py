"""`nodus`: the customer CLI over the REST API (and the operator verbs over gRPC)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Iterable

import orjson
import yaml

from . import (attempts, budgets, cancel, checkpoint, credits, data, describe, estimate, images, nodes, pricebook,
               sweeps, tokens, up)
from .client import CliError, Client

TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _print_table(table: dict[str, Any], wide: bool, header: bool = True, namespace_col: bool = False) -> None:
    cols = [i for i, c in enumerate(table["columnDefinitions"]) if wide or c.get("priority", 0) == 0]
    names = [table["columnDefinitions"][i]["name"].upper() for i in cols]
    rows = [[str(r["cells"][i]) for i in cols] for r in table.get("rows", [])]
    if namespace_col:
        names.insert(0, "PROJECT")
        for r, raw in zip(rows, table.get("rows", [])):
            r.insert(0, raw["object"]["metadata"].get("namespace", ""))
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    lines = ([names] if header else []) + rows
    for line in lines:
        print("   ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings (scripts in args) as literal blocks, the way people write them."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _dump(obj: Any, output: str) -> None:
    if output == "json":
        sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(yaml.dump(obj, Dumper=_Dumper, sort_keys=False, allow_unicode=True))


def _documents(path: str) -> Iterable[dict[str, Any]]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    for doc in yaml.safe_load_all(text):
        if doc is None:
            continue
        if isinstance(doc, dict) and doc.get("kind", "").endswith("List") and "items" in doc:
            yield from doc["items"]
        elif isinstance(doc, dict):
            yield doc
        else:
            raise CliError(f"{path}: every document must be an object with apiVersion and kind")


def cmd_apply(client: Client, args: argparse.Namespace) -> int:
    docs = list(_documents(args.filename))
    pushed: dict[str, str] = {}  # --source DIR, pushed once per project that a Job of the file is in
    if args.source and not any(d.get("kind") == "Job" for d in docs):
        raise CliError(f"--source: {args.filename} holds no Job to run the code of {args.source}",
                       "apply a file with a Job, or push the directory alone with `nodus source push DIR`")
    for doc in docs:
        r = client.for_kind(doc.get("kind", ""), doc.get("apiVersion", ""))
        meta = doc.setdefault("metadata", {})
        name = meta.get("name")
        namespace = meta.get("namespace") or client.namespace
        if args.source and doc.get("kind") == "Job":
            if namespace not in pushed:
                pushed[namespace] = data.push_source(client, namespace, args.source)["sha256"]
            doc.setdefault("spec", {})["source"] = {"blob": pushed[namespace]}
        if not name:
            raise CliError(f"{args.filename}: a {doc.get('kind')} needs metadata.name to be applied",
                           "set metadata.name (or use kubectl create for generateName)")
        applied = dict(doc)
        applied_meta = dict(meta)
        applied_meta.setdefault("annotations", {})
        applied_meta["annotations"] = {**applied_meta["annotations"],
                                       LAST_APPLIED: orjson.dumps(doc).decode()}
        applied["metadata"] = applied_meta
        try:
            current = client.request("GET", client.item(r, namespace, name)).json()
        except CliError as e:
            if "not found" not in e.message:
                raise
            bound = {"If-Match": args.if_match} if getattr(args, "if_match", None) else None
            client.request("POST", client.collection(r, namespace), body=applied, headers=bound,
                           params={"fieldManager": "nodus-apply", "fieldValidation": "Strict"})
            print(f"{r.singular}.{r.api_version.split('/')[0]}/{name} created")
            continue
        patch = _apply_patch(current, doc)
        if not patch:
            print(f"{r.singular}.{r.api_version.split('/')[0]}/{name} unchanged")
            continue
        patch.setdefault("metadata", {}).setdefault("annotations", {})[LAST_APPLIED] = orjson.dumps(doc).decode()
        before = current["metadata"]["resourceVersion"]
        after = client.request("PATCH", client.item(r, namespace, name), body=patch,
                               content_type="application/merge-patch+json",
                               params={"fieldManager": "nodus-apply", "fieldValidation": "Strict"}).json()
        verb = "configured" if after["metadata"]["resourceVersion"] != before else "unchanged"
        print(f"{r.singular}.{r.api_version.split('/')[0]}/{name} {verb}")
    return 0


def _apply_patch(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """A merge patch taking `current` to `desired` for the fields the file sets, and deleting
    fields the previous apply set that the file no longer has (kubectl's three-way rule)."""
    previous: dict[str, Any] = {}
    raw = (current.get("metadata", {}).get("annotations") or {}).get(LAST_APPLIED)
    if raw:
        try:
            previous = orjson.loads(raw)
        except orjson.JSONDecodeError:
            previous = {}

    def diff(cur: Any, want: Any, prev: Any) -> Any:
        if isinstance(want, dict) and isinstance(cur, dict):
            out: dict[str, Any] = {}
            for k, v in want.items():
                d = diff(cur.get(k), v, prev.get(k) if isinstance(prev, dict) else None)
                if d is not _SAME:
                    out[k] = d
            if isinstance(prev, dict):
                for k in prev:
                    if k not in want and k in cur:
                        out[k] = None
            return out if out else _SAME
        return _SAME if cur == want else want

    patch = diff({k: v for k, v in current.items() if k != "status"}, desired, previous)
    return {} if patch is _SAME else patch


_SAME: Any = object()


def cmd_get(client: Client, args: argparse.Namespace) -> int:
    r = client.resolve(args.kind)
    namespace = None if args.all_projects else (args.namespace or client.namespace)
    if r.plural == "attempts" and args.name:  # `nodus get attempts JOB` lists that Job's attempts
        args.selector, args.name = attempts.for_job(args.name, args.selector), None
    if args.name:
        path = client.item(r, namespace or client.namespace, args.name)
    else:
        path = client.collection(r, namespace)
    params = {k: v for k, v in (("labelSelector", args.selector), ("fieldSelector", args.field_selector)) if v}
    if args.output in ("json", "yaml"):
        _dump(client.request("GET", path, params=params).json(), args.output)
        return 0
    table = client.request("GET", path, params=params, headers={"Accept": TABLE_ACCEPT}).json()
    if not table.get("rows"):
        where = "any project" if namespace is None else f"{namespace} project"
        print(f"No {r.plural} found in {where}.", file=sys.stderr)
        return 0
    _print_table(table, args.output == "wide", namespace_col=namespace is None)
    if r.plural == "sweeps" and args.name:
        print()
        print("\n".join(sweeps.cell_table(client.request("GET", path).json())))
    return 0


def cmd_delete(client: Client, args: argparse.Namespace) -> int:
    r = client.resolve(args.kind)
    namespace = args.namespace or client.namespace
    for name in args.names:
        client.request("DELETE", client.item(r, namespace, name), body={"propagationPolicy": "Background"})
        print(f'{r.singular}.{r.api_version.split("/")[0]} "{name}" deleted')
    return 0


def cmd_watch(client: Client, args: argparse.Namespace) -> int:
    r = client.resolve(args.kind)
    namespace = None if args.all_projects else (args.namespace or client.namespace)
    params: dict[str, Any] = {"allowWatchBookmarks": "false"}
    if args.name:
        params["fieldSelector"] = f"metadata.name={args.name}"
    if args.progress is None:  # a bar on a terminal for one Job, lines elsewhere (pipes, logs)
        args.progress = sys.stdout.isatty() and not args.output
    if args.progress:
        if r.plural != "jobs" or not args.name:
            raise CliError("--progress follows one Job", "run `nodus watch job NAME --progress`")
        from rich.console import Console
        from .progress_view import follow
        try:
            return follow(args.name, client.watch(r, namespace, params), Console())
        except KeyboardInterrupt:
            return 130
    first = True
    try:
        for event in client.watch(r, namespace, params, table=args.output not in ("json", "yaml")):
            if event["type"] == "ERROR":
                status = event["object"]
                raise CliError(status.get("message", "watch failed"), status.get("fix", ""))
            if event["type"] == "BOOKMARK":
                continue
            if args.output in ("json", "yaml"):
                _dump(event, args.output)
                continue
            table = event["object"]
            if event["type"] == "DELETED":
                for row in table.get("rows", []):
                    row["cells"][0] = f"{row['cells'][0]} (deleted)"
            _print_table(table, args.output == "wide", header=first, namespace_col=namespace is None)
            first = False
            sys.stdout.flush()
    except KeyboardInterrupt:
        return 0
    return 0


def cmd_project_create(args: argparse.Namespace) -> int:
    from .operator import create_project
    project = create_project(args, args.name)
    print(f'project "{project["name"]}" created')
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nodus", description="Run GPU work to completion.")
    p.add_argument("--kubeconfig", help="kubeconfig to use (default $NODUS_KUBECONFIG, $KUBECONFIG, ~/.kube/config)")
    p.add_argument("-n", "--namespace", "--project", dest="namespace", help="project (namespace)")
    sub = p.add_subparsers(dest="command", required=True)

    a = sub.add_parser("apply", help="create or update objects from a file")
    a.add_argument("-f", "--filename", required=True, help="YAML or JSON file, or - for stdin")
    a.add_argument("--if-match", help="the ETag of `nodus estimate`: the create is bound to that estimate")
    a.add_argument("--source", metavar="DIR", help="push DIR as the Jobs' code and set their spec.source.blob")
    a.set_defaults(func=cmd_apply)

    g = sub.add_parser("get", help="list objects or show one")
    g.add_argument("kind")
    g.add_argument("name", nargs="?")
    g.add_argument("-o", "--output", choices=["json", "yaml", "wide"], help="output format")
    g.add_argument("-A", "--all-projects", action="store_true", help="every project you can read")
    g.add_argument("-l", "--selector", help="label selector")
    g.add_argument("--field-selector", help="field selector")
    g.set_defaults(func=cmd_get)

    d = sub.add_parser("delete", help="delete objects")
    d.add_argument("kind")
    d.add_argument("names", nargs="+")
    d.set_defaults(func=cmd_delete)

    w = sub.add_parser("watch", help="print changes as they happen")
    w.add_argument("kind")
    w.add_argument("name", nargs="?")
    w.add_argument("-o", "--output", choices=["json", "yaml", "wide"])
    w.add_argument("-A", "--all-projects", action="store_true")
    w.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a live progress bar of one Job until it ends, exit 0 if it succeeded "
                        "(default: on a terminal)")
    w.set_defaults(func=cmd_watch)

    data.add_parsers(sub)  # outputs, logs, volume
    checkpoint.add_parser(sub)  # save, restore, verify, ls
    up.add_parser(sub)  # coordinator + local agent
    pricebook.add_parser(sub)  # operator: apply, get, versions
    credits.add_parser(sub)  # balance, held, spent; operators grant
    budgets.add_parser(sub)  # monthly budgets: operators set and remove them
    estimate.add_parser(sub)  # a Job's estimate and its ETag
    cancel.add_parser(sub)  # a Job stopped for good
    describe.add_parser(sub)  # a Job's status, conditions, attempts and events
    images.add_parser(sub)  # image push / ls: the project's images in the operator's registry
    nodes.add_parsers(sub)  # operator: node ls / revoke / readmit, join-token rotate

    op = sub.add_parser("project", help="operator: projects")
    op.add_argument("--coordinator", help="gRPC HOST:PORT (default $NODUS_COORDINATOR, else the address the kubeconfig names, else 127.0.0.1:7070)")
    op_sub = op.add_subparsers(dest="action", required=True)
    create = op_sub.add_parser("create")
    create.add_argument("name")
    create.set_defaults(func=cmd_project_create, operator=True)
    tokens.add_parser(sub)  # operator: token create / ls / revoke
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "operator", False):
            code = args.func(args)
        else:
            code = args.func(Client.of(args), args)
    except CliError as e:
        print(f"error: {e.message}", file=sys.stderr)
        if e.fix:
            print(f"  fix: {e.fix}", file=sys.stderr)
        if e.request_id:
            print(f"  request: {e.request_id}", file=sys.stderr)
        code = 1
    except BrokenPipeError:
        code = 0
    sys.exit(code)


if __name__ == "__main__":
    main()
