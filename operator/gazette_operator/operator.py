"""The kopf operator: `JournalSpec` and `ShardSpec` resources into etcd specs.

Handlers are thin shells over `gazette_operator.sync` and `.ownership`:

- create/update/resume, and the drift timer: validate the resource; if invalid,
  ``Ready=False`` and ``Synced=False`` naming the field, nothing written (etcd keeps what
  was written before). A journal whose stores no registered broker serves is not
  written (``UnservedStores``) until one does. Else the spec is written for this
  resource: a spec another resource owns is refused (``OwnedElsewhere``, the status
  naming the owner), a spec changed or removed outside Kubernetes is restored (a
  ``Drift`` event), a renamed resource's old spec removed. etcd unreachable:
  ``Synced=False``, retried until it is back.
- delete (behind the finalizer): remove the specs this resource owns (the key derived
  from its spec, and the one its record names), leaving a tombstone that stops a drift
  check in flight from writing them again; with etcd unreachable in a namespace being
  deleted, the finalizer is let go.
- the timer also shows the route (primary and replicas) read from the assignments, and
  for shards the shard's state from its replicas' statuses.
- cleanup (the operator stopping): finalizers in namespaces being deleted are let go.

`registry` holds the handlers; `run` runs them with kopf's peering (two replicas never
both act) and its liveness endpoint. Configured by environment (`Config`).
"""

from __future__ import annotations

import asyncio
import datetime
import os
from collections.abc import Mapping
from typing import Any

import kopf
from prometheus_client import Counter

from gazette import names
from gazette.allocator import assignments_from, route_of
from gazette.auth import TLSFiles
from gazette.errors import GazetteError, ValidationError
from gazette.keyspace import BROKER_ROOT, CONSUMER_ROOT, Etcd
from gazette.protocol import JournalSpec
from gazette_operator.crds import GROUP, VERSION
from gazette_operator.kube import KubeApi, KubeError, let_go_in_terminating, namespace_terminating
from gazette_operator.ownership import (
    Conflict,
    Deleting,
    OwnedElsewhere,
    Owner,
    Stale,
    Written,
)
from gazette_operator.sync import (
    JOURNAL_KIND,
    SHARD_KIND,
    Declared,
    SpecWriter,
    declared,
    declared_key,
    route_names,
    shard_state,
    unserved,
)

KINDS = {"journalspecs": JOURNAL_KIND, "shardspecs": SHARD_KIND}
DEFAULT_FINALIZER = f"{GROUP}/finalizer"

WRITES = Counter("gazette_operator_spec_writes_total", "Specs written into etcd", ["kind"])
INVALID = Counter("gazette_operator_invalid_resources_total",
                  "Resources refused by validation (nothing written)", ["kind"])
DRIFTS = Counter("gazette_operator_drift_repairs_total",
                 "Specs changed or removed outside Kubernetes and restored", ["kind"])
ETCD_ERRORS = Counter("gazette_operator_etcd_errors_total", "Failed etcd operations")
for _plural in KINDS:  # exported at 0: panels and alerts see the first
    for _counter in (WRITES, INVALID, DRIFTS):
        _counter.labels(_plural)


class Config:
    """Where etcd is, the prefixes specs and ownership records go under, and the
    finalizer (from the environment); `ValidationError` naming a bad variable."""

    def __init__(self, env: Mapping[str, str] = os.environ) -> None:
        self.etcd_address = env.get("ETCD_ADDRESS", "http://localhost:2379")
        self.etcd_tls = etcd_tls(env)
        self.broker_root = env.get("BROKER_ETCD_PREFIX", BROKER_ROOT)
        self.consumer_root = env.get("CONSUMER_ETCD_PREFIX", CONSUMER_ROOT)
        self.operator_root = names.validate_etcd_prefix(
            env.get("OPERATOR_ETCD_PREFIX") or f"{self.broker_root}-operator",
            "OPERATOR_ETCD_PREFIX")
        self.drift_interval = float(env.get("DRIFT_INTERVAL", "30"))
        self.finalizer = validate_finalizer(env.get("FINALIZER") or DEFAULT_FINALIZER)
        self.namespaces = [n for n in env.get("WATCH_NAMESPACES", "").split(",") if n]

    @property
    def tombstone_ttl(self) -> int:
        """How long a deleted resource's tombstone outlives it: longer than any drift
        check in flight."""
        return int(max(60.0, 3 * self.drift_interval))


#: The environment of etcd's client TLS (as the chart sets it under ``etcd.tls``).
ETCD_TLS_ENV = {"cert_file": "ETCD_CERT_FILE", "key_file": "ETCD_KEY_FILE",
                "ca_file": "ETCD_CA_FILE"}


def etcd_tls(env: Mapping[str, str]) -> TLSFiles | None:
    """etcd's client TLS from the environment (None: none set: an ``https://`` etcd is
    then verified with the system's CAs)."""
    files = {field: env.get(name, "") for field, name in ETCD_TLS_ENV.items()}
    if not any(files.values()):
        return None
    try:
        return TLSFiles(cert_file=files["cert_file"], key_file=files["key_file"],
                        ca_file=files["ca_file"])
    except ValidationError as err:
        field = err.field.removeprefix("tls.").replace("-", "_")
        raise ValidationError(ETCD_TLS_ENV.get(field, "ETCD_CERT_FILE"), err.reason) from None


def validate_finalizer(value: str) -> str:
    """A qualified name, ``<DNS subdomain>/<name>``, as the API server wants."""
    prefix, slash, name = value.partition("/")
    labels = prefix.split(".")
    if not slash or not name or len(name) > 63 or len(prefix) > 253 or not all(
            lb and len(lb) <= 63 and lb.isascii() and lb.replace("-", "").isalnum()
            and lb == lb.lower() and lb[0] != "-" and lb[-1] != "-" for lb in labels) \
            or not all(c.isalnum() or c in "-_." for c in name):
        raise ValidationError("FINALIZER", f"{value!r} is not a qualified name such as "
                              f"gazette.{GROUP}/finalizer (a DNS subdomain, '/', a name)")
    return value


def _condition(kind: str, ok: bool, reason: str, message: str,
               generation: int | None) -> dict[str, Any]:
    return {"type": kind, "status": "True" if ok else "False", "reason": reason,
            "message": message, "observedGeneration": generation,
            "lastTransitionTime": datetime.datetime.now(datetime.UTC).isoformat()}


def _set_status(patch: kopf.Patch, status: Mapping[str, Any], *conditions: dict[str, Any],
                **fields: Any) -> None:
    """Patch the status where it changes: `conditions` replace those of their type (a
    condition whose status stays keeps its transition time); `fields` as given."""
    old = {c.get("type"): c for c in status.get("conditions", []) or []}
    merged = dict(old)
    for c in conditions:
        before = old.get(c["type"])
        if before is not None and before.get("status") == c["status"]:
            c = {**c, "lastTransitionTime": before.get("lastTransitionTime")}
        merged[c["type"]] = c
    changes: dict[str, Any] = dict(fields)
    if list(merged.values()) != list(old.values()):
        changes["conditions"] = list(merged.values())
    states = {t: c.get("status") for t, c in merged.items()}
    changes["ready"] = "True" if states.get("Ready") == "True" and \
        states.get("Synced") == "True" else "False"
    for key, value in changes.items():
        if status.get(key) != value:
            patch.status[key] = value


def _reason(status: Mapping[str, Any], kind: str) -> str | None:
    return next((c.get("reason") for c in status.get("conditions", []) or []
                 if c.get("type") == kind), None)


async def _writer(memo: Any) -> SpecWriter:
    if getattr(memo, "etcd", None) is None:
        memo.etcd = Etcd(memo.config.etcd_address, tls=memo.config.etcd_tls)
        await memo.etcd.connect()
    return SpecWriter(memo.etcd, memo.config.operator_root)


def _owner(resource: str, meta: Mapping[str, Any]) -> Owner:
    return Owner(KINDS[resource], str(meta.get("namespace") or ""), str(meta.get("name")),
                 str(meta.get("uid") or ""), int(meta.get("generation") or 0))


async def _startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    if getattr(memo, "config", None) is None:
        memo.config = Config()
    settings.persistence.finalizer = memo.config.finalizer
    settings.posting.level = 20  # INFO and above become Kubernetes events
    # The namespaces watched are named, and the CRDs come with the chart: no listing or
    # watching of either (which the chart's RBAC does not grant anyway).
    settings.scanning.disabled = True


async def _cleanup(memo: Any, logger: Any, **_: Any) -> None:
    """Let go of finalizers in namespaces being deleted: this operator is stopping with
    them, and nothing else would remove its finalizer."""
    connection = getattr(memo, "connection", None)
    if connection is not None:
        try:
            async with KubeApi(connection) as api:
                dropped = await asyncio.wait_for(let_go_in_terminating(
                    api, memo.config.namespaces, memo.config.finalizer), 10)
            if dropped:
                logger.warning("namespace being deleted: let go of %s", ", ".join(dropped))
        except (KubeError, OSError, TimeoutError) as err:
            logger.warning("could not check for namespaces being deleted: %s", err)
    if getattr(memo, "etcd", None) is not None:
        await memo.etcd.close()


class _Handling:
    """One handler call's resource: what it declares, its status, and how to report."""

    def __init__(self, kwargs: dict[str, Any], timer: bool) -> None:
        self.plural: str = kwargs["resource"].plural
        self.body, self.spec, self.status = kwargs["body"], kwargs["spec"], kwargs["status"]
        self.patch, self.memo, self.logger = kwargs["patch"], kwargs["memo"], kwargs["logger"]
        self.meta = kwargs["meta"]
        self.generation = self.meta.get("generation")
        self.owner = _owner(self.plural, self.meta)
        self.timer = timer

    def declared(self) -> Declared:
        cfg: Config = self.memo.config
        return declared(KINDS[self.plural], dict(self.spec), cfg.broker_root,
                        cfg.consumer_root)

    def refuse(self, ready: bool, reason: str, message: str, **fields: Any) -> None:
        """Not written: the status says why; a Warning event when the reason is new."""
        new = _reason(self.status, "Synced") != reason
        _set_status(self.patch, self.status,
                    _condition("Ready", ready, "Valid" if ready else reason,
                               "the spec is valid" if ready else message, self.generation),
                    _condition("Synced", False, reason, f"not written: {message}",
                               self.generation),
                    observedGeneration=self.generation, **fields)
        if new or not self.timer:
            kopf.warn(self.body, reason=reason, message=message)


async def _reconcile(h: _Handling) -> None:
    """Write what the resource declares into etcd for it, or say why not."""
    try:
        d = h.declared()
    except ValidationError as err:
        if _reason(h.status, "Ready") != "InvalidSpec" or not h.timer:
            INVALID.labels(h.plural).inc()
        h.refuse(False, "InvalidSpec", f"{err} (etcd keeps what was written before, if "
                 "anything; fixed, the resource is written)")
        return
    try:
        writer = await _writer(h.memo)
        note = ""
        if isinstance(d.spec, JournalSpec):
            brokers = await writer.brokers(d.layout)
            why = unserved(d.spec.fragment.stores, brokers)
            if why is not None:
                h.refuse(False, "UnservedStores", f"spec.fragment.stores: {why}")
                return
            note = "" if brokers else " (no broker is registered yet: its stores are unchecked)"
        written = await writer.write(d, h.owner)
    except OwnedElsewhere as err:
        h.refuse(True, "OwnedElsewhere", f"{d.name} is declared by {err.owner} (it owns "
                 f"{err.key}); this resource takes over once that one is deleted",
                 owner=err.owner)
        return
    except (Deleting, Stale) as err:
        h.logger.debug("not written: %s", err)
        return
    except Conflict as err:
        if h.timer:
            return  # a concurrent write: the next check sees it
        raise kopf.TemporaryError(f"etcd: {err}", delay=1) from err
    except (GazetteError, OSError) as err:
        ETCD_ERRORS.inc()
        _set_status(h.patch, h.status,
                    _condition("Synced", False, "EtcdUnavailable", str(err), h.generation))
        if h.timer:
            return
        raise kopf.TemporaryError(f"etcd: {err}", delay=5) from err
    _report(h, d, written)
    fields: dict[str, Any] = {}
    if h.timer:
        try:
            fields["primary"], fields["replicas"] = await _route(h.memo, d)
            if h.plural == "shardspecs":
                fields["state"] = await _shard_state(h.memo, d)
        except (GazetteError, OSError) as err:
            h.logger.warning("cannot read the route of %s: %s", d.name, err)
    _set_status(h.patch, h.status,
                _condition("Ready", True, "Valid", "the spec is valid" + note, h.generation),
                _condition("Synced", True, "Written", f"{d.key} at revision {written.revision}",
                           h.generation),
                observedGeneration=h.generation, etcdKey=d.key, modRevision=written.revision,
                owner=h.owner.resource, **fields)


def _report(h: _Handling, d: Declared, written: Written) -> None:
    if written.changed:
        WRITES.labels(h.plural).inc()
        h.logger.info("%s written to %s at revision %d", d.name, d.key, written.revision)
    if written.moved_from:
        kopf.info(h.body, reason="Moved", message=f"{written.moved_from} removed: the "
                  f"resource now declares {d.key}")
    if written.repaired or (h.timer and written.changed):
        DRIFTS.labels(h.plural).inc()
        kopf.warn(h.body, reason="Drift", message=f"{d.key} was changed or removed outside "
                  f"Kubernetes: restored the declared spec at revision {written.revision}")


def _drop_legacy_finalizer(kwargs: dict[str, Any]) -> None:
    """Resources from before FINALIZER was set per installation carry the default one,
    which nothing would remove any more: dropped from the resources this operator holds
    under a finalizer of its own."""
    mine: str = kwargs["memo"].config.finalizer
    if mine == DEFAULT_FINALIZER or DEFAULT_FINALIZER not in (
            kwargs["meta"].get("finalizers") or []):
        return

    def drop(body: dict[str, Any]) -> None:
        finalizers = body.get("metadata", {}).get("finalizers") or []
        body["metadata"]["finalizers"] = [f for f in finalizers if f != DEFAULT_FINALIZER]

    kwargs["patch"].fns.append(drop)
    kwargs["logger"].info("dropping the finalizer %s, now %s", DEFAULT_FINALIZER, mine)


async def _sync(**kwargs: Any) -> None:
    _drop_legacy_finalizer(kwargs)
    await _reconcile(_Handling(kwargs, timer=False))


async def _drift(**kwargs: Any) -> None:
    if kwargs["meta"].get("deletionTimestamp"):
        return  # being deleted: the delete handler owns it
    await _reconcile(_Handling(kwargs, timer=True))


async def _delete(**kwargs: Any) -> None:
    resource: str = kwargs["resource"].plural
    spec, status, memo = kwargs["spec"], kwargs["status"], kwargs["memo"]
    logger, meta = kwargs["logger"], kwargs["meta"]
    cfg: Config = memo.config
    _drop_legacy_finalizer(kwargs)
    keys = {k for k in (declared_key(KINDS[resource], dict(spec), cfg.broker_root,
                                     cfg.consumer_root), status.get("etcdKey")) if k}
    try:
        writer = await _writer(memo)
        removed = await writer.remove(_owner(resource, meta), keys, cfg.tombstone_ttl)
    except (GazetteError, OSError) as err:
        ETCD_ERRORS.inc()
        if await _namespace_going(memo, str(meta.get("namespace") or ""), logger):
            logger.warning("etcd unreachable (%s) and the namespace is being deleted: "
                           "letting go without removing %s", err, ", ".join(sorted(keys)))
            return
        raise kopf.TemporaryError(f"etcd: {err}", delay=5) from err
    if removed:
        logger.info("removed %s", ", ".join(removed))
    else:
        logger.info("nothing of this resource in etcd to remove (%s)",
                    ", ".join(sorted(keys)) or "no key")


async def _namespace_going(memo: Any, namespace: str, logger: Any) -> bool:
    connection = getattr(memo, "connection", None)
    if connection is None or not namespace:
        return False
    try:
        async with KubeApi(connection) as api:
            return await namespace_terminating(api, namespace)
    except (KubeError, OSError) as err:
        logger.warning("cannot read namespace %s: %s", namespace, err)
        return False


async def _route(memo: Any, d: Declared) -> tuple[str, list[str]]:
    """(primary, replicas) of a journal or shard, from a range read of its
    assignments."""
    result = await memo.etcd.get_prefix(d.layout.item_assignments(d.name))
    return route_names(route_of(assignments_from(d.layout, d.name, result.kvs)))


async def _shard_state(memo: Any, d: Declared) -> str:
    """The shard's combined replica status, from a range read of its statuses."""
    result = await memo.etcd.get_prefix(d.layout.item_statuses(d.name))
    return shard_state(kv.value for kv in result.kvs)


def build_registry(drift_interval: float) -> kopf.OperatorRegistry:
    """Every handler of the operator, drift checks every `drift_interval` seconds."""
    registry = kopf.OperatorRegistry()
    kopf.on.startup(registry=registry)(_startup)
    kopf.on.cleanup(registry=registry)(_cleanup)
    for plural in KINDS:
        kopf.on.create(GROUP, VERSION, plural, id="sync", registry=registry)(_sync)
        kopf.on.update(GROUP, VERSION, plural, id="sync", field="spec",
                       registry=registry)(_sync)
        kopf.on.resume(GROUP, VERSION, plural, id="sync", registry=registry)(_sync)
        kopf.on.delete(GROUP, VERSION, plural, id="remove", registry=registry)(_delete)
        kopf.on.timer(GROUP, VERSION, plural, id="drift", interval=drift_interval,
                      initial_delay=drift_interval, registry=registry)(_drift)
    return registry
