"""Per-kind behaviour of the resource service on create, update and delete, as Kubernetes' registry
has a strategy per kind: the service does what every kind shares (identity, admission, the store's
compare-and-swap) and calls these hooks where a kind differs. A Secret's values live in the vault,
versioned, and never in the stored object; a Job's images are resolved to digests on create, and
its status.estimate is computed (money/quote.py) from the active price book, a placement preview on
the fleet as the controllers' cache holds it (controllers/fleet.py), and this fleet's own history.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import uuid
from dataclasses import replace
from decimal import Decimal
from typing import Any

import orjson

from . import errors, git_access, sources
from .api.admission import Lookup
from .api.job_folding import effective_image
from .api.references import not_found, secret_version
from .clock import parse, rfc3339
from .controllers import workload_tokens
from .controllers.fleet import Fleet
from .controllers.sweep import cell_labels
from .controllers.views import topology
from .identity import Identity
from .images import ImageRefused, ImageResolver, RegistryCredentials, ResolvedImage, refusal, registry_of
from .money import quote
from .operator_registry import NameRefused, OperatorRegistry, split_name
from .money.budget_store import Budgets
from .money.credits import first_hold_refusal
from .money.ledger_store import Ledger
from .money.pricebook import PriceBook
from .scheduler import NodeView, Request, Reservation, place
from .scheduler_classes import NodeClasses
from .store.base import Store
from .vault import Vault

Values = dict[str, str]
"""A Secret's values (base64, as `data` holds them), on their way to the vault."""


class KindStrategy:
    """The default: nothing beyond the shared rules; a changed spec moves metadata.generation."""

    def on_create(self, obj: dict[str, Any], now: str) -> Values | None:
        """Shapes an admitted new object; returns values the store must not hold (None: none)."""
        return None

    async def prepare(self, project: str, obj: dict[str, Any], if_match: str = "") -> None:
        """After `on_create`, before anything is written (a dry run too): what needs I/O to admit.
        `if_match` is the create's If-Match header: the ETag of the estimate it is bound to; a kind
        without estimates refuses it rather than ignore a binding the client asked for."""
        if if_match:
            refuse_binding(obj)

    async def readable(self, project: str, name: str, old: dict[str, Any], base: dict[str, Any]) -> None:
        """Adds to `base` (a copy of the stored object) what a patch applies to but the store lacks."""

    async def on_update(self, project: str, name: str, old: dict[str, Any], result: dict[str, Any],
                        now: str) -> Values | None:
        """Shapes an admitted update of the spec; returns values the store must not hold (None: none)."""
        if result.get("spec") != old.get("spec"):
            result["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        return None

    async def keep(self, project: str, name: str, obj: dict[str, Any], values: Values) -> None:
        """Stores `values` elsewhere, before the object that names them is written."""

    def refuse(self, obj: dict[str, Any]) -> None:
        """Raises what a real create refuses that a dry run only reports (in status.estimate)."""

    async def on_delete(self, project: str, name: str) -> None:
        """After the object is deleted."""


class SecretStrategy(KindStrategy):
    """A Secret's data goes to the vault, one version per change of values; the object keeps the
    status (version, keys, versions) and no values, not even in kubectl's last-applied annotation."""

    def __init__(self, vault: Vault) -> None:
        self.vault = vault

    def on_create(self, obj: dict[str, Any], now: str) -> Values | None:
        values: Values = obj.pop("data", {}) or {}
        obj.pop("stringData", None)
        _scrub_last_applied(obj)
        obj["status"] = _secret_status(None, 1, values, now)
        return values

    async def readable(self, project: str, name: str, old: dict[str, Any], base: dict[str, Any]) -> None:
        base["data"] = await self.vault.get(project, name, old["status"]["version"])

    async def on_update(self, project: str, name: str, old: dict[str, Any], result: dict[str, Any],
                        now: str) -> Values | None:
        values: Values | None = result.pop("data", None)
        result.pop("stringData", None)
        _scrub_last_applied(result)
        if values is not None and values == await self.vault.get(project, name, old["status"]["version"]):
            values = None  # same values: no new version
        if values is not None:
            version = old["status"]["version"] + 1
            result["status"] = _secret_status(old["status"], version, values, now)
            result["metadata"]["generation"] = old["metadata"]["generation"] + 1
        return values

    async def keep(self, project: str, name: str, obj: dict[str, Any], values: Values) -> None:
        await self.vault.put(project, name, obj["status"]["version"], values)

    async def on_delete(self, project: str, name: str) -> None:
        await self.vault.drop(project, name)


class ServiceAccountStrategy(KindStrategy):
    """Deleting a ServiceAccount, or lowering its role, revokes its live workload tokens at once (ADR 0055);
    the controller's resync would reach them within a quarter of their lifetime, this makes it immediate."""

    def __init__(self, identity: Identity, store: Store) -> None:
        self.identity, self.store = identity, store

    async def on_update(self, project: str, name: str, old: dict[str, Any], result: dict[str, Any],
                        now: str) -> Values | None:
        if workload_tokens.role_of(result) < workload_tokens.role_of(old):
            await workload_tokens.revoke_account(self.identity, self.store, project, name, "its role was lowered")
        return await super().on_update(project, name, old, result, now)

    async def on_delete(self, project: str, name: str) -> None:
        await workload_tokens.revoke_account(self.identity, self.store, project, name)


class JobStrategy(KindStrategy):
    """A Job's `image` and its sidecars' own images are resolved on create, with the Job's
    imagePullSecrets, to the digests every attempt runs: `status.image` {reference, digest, user} and
    `status.sidecarImages[]` (the same and the sidecar's name). The pull secrets are pinned in
    status.secretVersions as mounted Secrets are, so every attempt pulls with the same credentials.
    spec.image is immutable (JobSpec), so an update never needs resolving again. Without a resolver
    (a service built without one) images are admitted as written.

    Then `status.estimate` (`Estimates`), dry runs too; a create sent with If-Match is bound to the
    estimate its ETag names (status.estimate.binding, which placement holds to) or refused with
    EstimateExpired when the ETag is no estimate of this exact spec."""

    def __init__(self, vault: Vault, images: ImageResolver | None, lookup: Lookup,
                 estimates: Estimates | None = None, store: Store | None = None) -> None:
        self.vault, self.images, self.lookup, self.estimates, self.store = vault, images, lookup, estimates, store

    async def prepare(self, project: str, obj: dict[str, Any], if_match: str = "") -> None:
        await _pin_source(obj, project, self.store, self.lookup.get, self.vault)
        if self.images is not None:
            await self._pin_images(self.images, project, obj)
        else:  # no resolver: an imageRef cannot be resolved, so it is refused, never ignored
            project_image(obj.get("spec") or {}, None, project, obj["metadata"]["name"])
        if self.estimates is None:
            if if_match:
                refuse_binding(obj)
            return
        estimate = await self.estimates.estimate(project, obj.get("spec") or {}, obj.get("status") or {},
                                                 (obj.get("metadata") or {}).get("labels") or {})
        obj.setdefault("status", {})["estimate"] = bind(estimate, obj, if_match, "jobs", self.estimates.sign)

    def refuse(self, obj: dict[str, Any]) -> None:
        """A create whose first hold the project's credits cannot take is refused with the words its
        estimate's blockingReasons show (a dry run still answers, with them)."""
        refuse_unfunded(obj, "jobs")

    async def _pin_images(self, images: ImageResolver, project: str, obj: dict[str, Any]) -> None:
        spec, name = obj.get("spec") or {}, obj["metadata"]["name"]
        sidecars = [(i, s) for i, s in enumerate(spec.get("sidecars") or []) if s.get("image")]
        own = project_image(spec, images.operator, project, name)  # spec.imageRef in the operator's registry
        if not spec.get("image") and not own and not sidecars:
            return
        status = obj.setdefault("status", {})
        credentials = await self._pull_secrets(project, name, spec.get("imagePullSecrets") or [], status)
        resolved: dict[str, ResolvedImage] = {}

        async def resolve(image: str, path: str) -> ResolvedImage:
            if image not in resolved:
                try:
                    resolved[image] = await images.resolve(image, _login_for(image, credentials), project)
                except ImageRefused as e:
                    raise refusal(e, "Job", name, path) from None
            return resolved[image]

        if spec.get("image"):
            status["image"] = (await resolve(spec["image"], "spec.image")).as_status()
        elif own:
            status["image"] = (await resolve(own, "spec.imageRef")).as_status()
        pins = []
        for i, sidecar in sidecars:
            got = await resolve(sidecar["image"], f"spec.sidecars[{i}].image")
            pins.append({"name": sidecar["name"], **got.as_status()})
        if pins:
            status["sidecarImages"] = pins

    async def _pull_secrets(self, project: str, name: str, names: list[str],
                            status: dict[str, Any]) -> list[RegistryCredentials]:
        """Each named Secret's credentials at its latest version, pinned in `status`."""
        out = []
        for i, secret_name in enumerate(names):
            path = f"spec.imagePullSecrets[{i}]"
            secret = await self.lookup.get("secrets", project, secret_name)
            chosen = secret_version(secret, None) if secret is not None else None
            if chosen is None or chosen.get("version") is None:
                raise errors.invalid("Job", name, [not_found(path, secret_name)],
                                     fix=f"create Secret {secret_name} in project {project} with the registry's "
                                         "credentials (.dockerconfigjson, or username and password), or drop it "
                                         "from spec.imagePullSecrets")
            values = await self.vault.get(project, secret_name, int(chosen["version"]))
            try:
                out.append(RegistryCredentials.from_secret(secret_name, {k: _raw(v) for k, v in values.items()}))
            except ImageRefused as e:
                raise refusal(e, "Job", name, path) from None
            status.setdefault("secretVersions", {}).setdefault(secret_name, chosen["version"])
            if chosen.get("versionID") is not None:
                status.setdefault("secretVersionIDs", {}).setdefault(secret_name, chosen["versionID"])
        return out


def refuse_binding(obj: dict[str, Any]) -> None:
    """If-Match on a create that has no estimate to bind (a kind without one, or no pricing)."""
    kind = obj.get("kind") or "this kind"
    raise errors.NodusError("BadRequest", f"If-Match binds a create to its estimate, and a {kind} create has none here",
                     fix="drop the If-Match header (it binds Job and Sweep creates to a dry run's estimate ETag)")


def bind(estimate: dict[str, Any], obj: dict[str, Any], if_match: str, plural: str, sign: quote.Signer) -> dict[str, Any]:
    """`estimate`, bound to the dry run's estimate `if_match` names (its `binding`); EstimateExpired
    when that is no estimate of this exact spec."""
    if not if_match:
        return estimate
    bound = quote.binding(if_match, obj.get("spec"), sign)
    if bound is None:
        raise errors.NodusError(
            "EstimateExpired", f"If-Match {if_match} is not an estimate of this exact spec: the spec changed since "
            "the dry run, or the ETag came from another object", name=obj["metadata"]["name"], kind=plural,
            group="nodus.dev",
            fix="run the dry run again (?dryRun=All, or `nodus estimate -f FILE`) and create with its ETag")
    return {**estimate, "binding": bound.as_status()}


class SweepStrategy(KindStrategy):
    """A Sweep's status.estimate: its cells' estimates summed (`quote.combine`). Cells that differ only in
    params or repetition price the same, so each GPU × region combination is estimated once. A create
    with If-Match is bound as a Job's is (status.estimate.binding); no cells run yet, so nothing places
    under the bound until a Sweep controller creates them with it."""

    def __init__(self, estimates: Estimates) -> None:
        self.estimates = estimates

    async def prepare(self, project: str, obj: dict[str, Any], if_match: str = "") -> None:
        spec = obj.get("spec") or {}
        template = dict((spec.get("template") or {}).get("spec") or {})
        matrix = spec.get("matrix") or {}
        same = int(spec.get("repetitions") or 1)
        for values in (matrix.get("params") or {}).values():
            same *= max(len(values or []), 1)
        cells = []
        regions = matrix.get("regions") or [None]
        for g, gpu in enumerate(matrix.get("gpu") or [None]):
            for r, region in enumerate(regions):
                cell = dict(template)
                if gpu is not None:
                    cell["resources"] = {**(cell.get("resources") or {}), "gpu": gpu}
                if region is not None:
                    cell["placement"] = {**(cell.get("placement") or {}), "regions": [region]}
                # Its first hold must fit the Budgets the cell Jobs count towards: those of the group's
                # first cell's labels (controllers/sweep.py: index = (gpu · R + region) · same + …).
                labels = cell_labels(obj, (g * len(regions) + r) * same)
                cells.append((await self.estimates.estimate(project, cell, {}, labels), same))
        estimate = quote.combine(cells, int(spec.get("maxParallel") or 4))
        obj.setdefault("status", {})["estimate"] = bind(estimate, obj, if_match, "sweeps", self.estimates.sign)

    def refuse(self, obj: dict[str, Any]) -> None:
        """A Sweep whose cells' first holds cannot be taken (the credits, or a Budget its cells count
        towards) is refused as a Job would be, rather than admitted with cells that every create refuses."""
        refuse_unfunded(obj, "sweeps")


def refuse_unfunded(obj: dict[str, Any], plural: str) -> None:
    """Raises the InsufficientCredits of the estimate's blockingReasons (credits or a Budget), if any."""
    for blocking in ((obj.get("status") or {}).get("estimate") or {}).get("blockingReasons") or []:
        if blocking.get("code") == "InsufficientCredits":
            raise errors.NodusError("InsufficientCredits", blocking["message"], name=obj["metadata"]["name"],
                                    kind=plural, group="nodus.dev", fix=blocking.get("fix", ""))


def _login_for(image: str, credentials: list[RegistryCredentials]) -> RegistryCredentials | None:
    """The first pull secret that logs in to the image's registry (a username/password pair logs in to
    any), as one username/password pair."""
    registry = registry_of(image)
    for creds in credentials:
        for host, username, password in creds.logins(registry):
            if host == registry:
                return RegistryCredentials(username=username, password=password)
    return None


def _raw(value: str) -> bytes:
    """A Secret value as the vault holds it (base64) in bytes."""
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return value.encode()


async def _pin_source(obj: dict[str, Any], project: str, store: Store | None, read: git_access.Read,
                      vault: Vault) -> None:
    """status.source: the commit spec.source.git names now, or the blob the project pushed (sources.py);
    spec.source is immutable, so this runs on create only."""
    source = (obj.get("spec") or {}).get("source") or {}
    if source.get("blob") and store is not None:
        sha = str(source["blob"]).removeprefix("sha256:")
        if await sources.uploaded(store, project, sha) is None:
            raise errors.invalid("Job", obj["metadata"]["name"], [errors.invalid_value(
                "spec.source.blob", source["blob"], f"no source with this sha256 was pushed to project {project}")],
                fix="push the directory first (`nodus source push DIR` prints the sha256: to use), or apply the Job "
                    "with `nodus apply -f JOB --source DIR`")
        obj.setdefault("status", {})["source"] = {"blob": source["blob"]}
    git = source.get("git")
    if not git:
        return
    login = await git_access.login_for(read, vault, project, obj.get("spec") or {}, sources.repo_url(git["repo"]))
    try:
        commit = await sources.resolve(git["repo"], git.get("ref") or "",
                                       auth=git_access.git_env(login.username, login.password) if login else None)
    except sources.SourceRefused as e:
        value = git["repo"] if e.field.endswith(".repo") else git.get("ref", "")
        fix = "name a repository the coordinator can read and a branch, tag or full commit of it"
        if login is not None and e.field.endswith(".repo"):
            e.message += (f' (read with the username and password of Secret "{login.secret}", through Git Connection '
                          f'"{login.connection}" of spec.connections)')
            fix = f"update Secret {login.secret} with a username and token that can read the repository"
        elif e.field.endswith(".repo"):
            fix += "; for a private repository list a Git Connection whose spec.git.urlPrefix covers it in " \
                   "spec.connections"
        raise errors.invalid("Job", obj["metadata"]["name"], [errors.invalid_value(e.field, value, e.message)],
                             fix=fix) from None
    obj.setdefault("status", {})["source"] = {"commit": commit}


def strategies(vault: Vault, images: ImageResolver | None = None, lookup: Lookup | None = None,
               store: Store | None = None, fleet: Fleet | None = None,
               identity: Identity | None = None) -> dict[str, KindStrategy]:
    """The strategy of each kind that has its own (by kind name); every other kind takes the default.
    Without `images` (a resource service built without a resolver) a Job's images are admitted as
    written; without `store` and `fleet` it gets no estimate."""
    own: dict[str, KindStrategy] = {"Secret": SecretStrategy(vault)}
    if identity is not None and store is not None:
        own["ServiceAccount"] = ServiceAccountStrategy(identity, store)
    estimates = Estimates(store, fleet, vault.signer(quote.ETAG_PURPOSE)) \
        if store is not None and fleet is not None else None
    if lookup is not None and (images is not None or estimates is not None):
        own["Job"] = JobStrategy(vault, images, lookup, estimates, store)
    if estimates is not None:
        own["Sweep"] = SweepStrategy(estimates)
    return own


class Estimates:
    """What a Job's estimate reads: the fleet (the active price book, the nodes and their leases, what
    live attempts hold, the nodes kept warm, the start times measured per offering, the project's
    finished Jobs for a duration) from the controllers' watch-fed cache and indexes, so that a create
    costs the same however many Jobs and Attempts the store holds; the project's credits (only with a
    price book) from the ledger."""

    def __init__(self, store: Store, fleet: Fleet, sign: quote.Signer) -> None:
        self.fleet = fleet
        self.ledger = Ledger(store)
        self.budgets = Budgets(store, self.ledger)
        self.sign = sign
        """The coordinator's keyed digest that a dry run's ETag carries (quote.etag)."""

    async def estimate(self, project: str, spec: dict[str, Any], status: dict[str, Any],
                       labels: dict[str, str] | None = None) -> dict[str, Any]:
        """The estimate of a Job of `spec` (`status`: what admission pinned, such as its image digest)."""
        fleet = self.fleet
        now = fleet.clock.now()
        book = fleet.book()
        if book is None:
            return self._quote(project, spec, status, book, now)
        # The balance and the Budgets are read from the store (the ledger is not in the cache, and another
        # replica may have posted): both reads go to the store's reader at once, while this thread quotes.
        accounts = asyncio.ensure_future(self.ledger.accounts(project))
        budgets = asyncio.ensure_future(self.budgets.of_project(project))
        await asyncio.sleep(0)  # the reads start (are handed to the store's reader) before the quote runs
        try:
            estimate = self._quote(project, spec, status, book, now)
        except BaseException:
            accounts.cancel()
            budgets.cancel()
            raise
        hold = Decimal(estimate.get("holdUSD") or 0)
        funds, listed = await asyncio.gather(accounts, budgets)
        if hold > 0:  # the first hold must fit the project's credits
            refusal = first_hold_refusal(funds, hold, "this Job")
            if refusal is None and any(b.matches(labels or {}) for b in listed):  # and every matching Budget
                # (the project's Jobs' labels, which a Budget's room sums by, are gathered only then)
                refusal = await self.budgets.first_hold_refusal(project, fleet.labels_of(project), rfc3339(now)[:7],
                                                                labels or {}, hold, "this Job")
            if refusal is not None:
                estimate["blockingReasons"] = [*estimate.get("blockingReasons", []), refusal]
        return estimate

    def _quote(self, project: str, spec: dict[str, Any], status: dict[str, Any], book: PriceBook | None,
               now: float) -> dict[str, Any]:
        """The estimate without the project's credits and Budgets: what the fleet's cache answers."""
        fleet = self.fleet
        nodes, free = fleet.rooms()  # each node's free capacity, kept between changes of the fleet
        held: list[Reservation] = []
        history: list[Decimal] = []
        overruns: list[Decimal] = []
        warm: list[Reservation] = []
        if book is not None:  # durations and warm nodes only change a priced estimate
            warm = fleet.warm(now)
            held = fleet.held() + warm  # one Reservation per node: the same free capacity, in O(nodes)
            history = fleet.history(project, (status.get("image") or {}).get("digest"), spec.get("command"))
            overruns = fleet.overruns(project)
        image = effective_image(spec, status)  # an imageRef Job needs a node that runs images too
        preview = self._preview(project, {**spec, "image": image} if image else spec, book, nodes, held, now,
                                None if warm else free)
        offering = preview.offering.id if preview.offering is not None else ""
        shape = quote.Shape.of(spec, history, topology(spec) if spec.get("distributed") else None, overruns)
        return quote.quote(book, shape, preview, quote.Startup(cold=fleet.start_seconds(offering)), now)

    @staticmethod
    def _preview(project: str, spec: dict[str, Any], book: PriceBook | None, nodes: list[NodeView],
                 held: list[Reservation], now: float, free: NodeClasses | None = None) -> quote.Preview:
        """Where one attempt of the Job would be placed now (a gang's first member, for its offering).
        `free`: the nodes' Rooms after `held`, grouped (NodeClasses), when the caller has them."""
        deadline = parse(spec.get("completeByTime"))
        within = None if deadline is None else Decimal(str(round(deadline - now, 3)))
        request = Request.of(spec.get("resources"), spec.get("image"), spec.get("placement"),
                             spec.get("expectedDuration"), within)
        request = replace(request, project=project)
        chosen = free.place(request, book=book) if free is not None else place(request, nodes, held, book=book)
        if chosen.offering is None and held and book is not None:
            # Nothing is free now: the Job will wait for capacity, and is priced as the offering it would
            # take once something frees up (the explain says it waits).
            later = place(request, nodes, [], book=book)
            if later.offering is not None:
                chosen = replace(later, explain=f"no capacity is free now; once it is: {later.explain}")
        region = next((n.region for n in nodes if n.name == chosen.node), "")
        return quote.Preview(chosen.offering, chosen.explain, chosen.warm_reuse, region)


def _secret_status(old: dict[str, Any] | None, version: int, values: Values, now: str) -> dict[str, Any]:
    version_id = str(uuid.uuid4())
    keys = sorted(values)
    versions = list((old or {}).get("versions", []))
    versions.append({"version": version, "versionID": version_id, "keys": keys, "createTime": now})
    return {"version": version, "versionID": version_id, "keys": keys, "versions": versions}


def _scrub_last_applied(obj: dict[str, Any]) -> None:
    """kubectl apply copies the whole file into an annotation; never keep secret values there."""
    annotations = obj.get("metadata", {}).get("annotations") or {}
    raw = annotations.get("kubectl.kubernetes.io/last-applied-configuration")
    if not raw:
        return
    try:
        applied = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return
    for field in ("data", "stringData"):
        if isinstance(applied.get(field), dict):
            applied[field] = {k: "" for k in applied[field]}
    annotations["kubectl.kubernetes.io/last-applied-configuration"] = orjson.dumps(applied).decode() + "\n"


def project_image(spec: dict[str, Any], operator: OperatorRegistry | None, project: str, job: str) -> str:
    """spec.imageRef (`NAME[:TAG]`, as `nodus image ls` lists the project's images) as a reference in the
    operator's registry; "" without one. Refused naming the field when it cannot be one."""
    ref = spec.get("imageRef")
    if not ref:
        return ""
    if spec.get("image"):
        raise errors.invalid("Job", job, [errors.invalid_value("spec.imageRef", ref, "set spec.image or spec.imageRef, "
                                                                                    "not both")],
                             fix="keep spec.image for an image in any registry, or spec.imageRef for one pushed "
                                 "with `nodus image push`")
    if operator is None:
        raise errors.invalid("Job", job, [errors.invalid_value(
            "spec.imageRef", ref, "this coordinator keeps no project images (it runs without --image-registry)")],
            fix="name the image in spec.image, or ask the operator to configure --image-registry")
    try:
        name, tag = split_name(str(ref))
        repository = operator.repository(project, name)
    except NameRefused as e:
        raise errors.invalid("Job", job, [errors.invalid_value("spec.imageRef", ref, str(e))],
                             fix="use NAME[:TAG] as `nodus image ls` lists it") from None
    return f"{operator.host}/{repository}:{tag}"
