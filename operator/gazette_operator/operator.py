"""The kopf operator: `JournalSpec` and `ShardSpec` resources into etcd specs.

Handlers are thin shells over `gazette_operator.sync`:

- create/update/resume: validate the resource; if invalid, ``Ready=False`` naming the
  field and nothing written; else write the spec (revision-guarded), record the etcd key
  and mod revision in the status, ``Synced=True``. etcd unreachable: ``Synced=False``
  with the reason, retried until it is back.
- delete (behind kopf's finalizer): remove the key, then the finalizer is released.
- a timer: drift (the etcd value changed or vanished outside Kubernetes) is repaired
  and recorded as a Kubernetes event; the status shows the route (primary and replicas)
  read from the assignments, and for shards the shard's state (``pending``,
  ``recovering``, ``standby``, ``primary``, or ``failed: <error>``) from the statuses
  its consumer members write.

`registry` holds the handlers; `run` runs them with kopf's peering (two replicas never
both act) and its liveness endpoint. Configured by environment: ``ETCD_ADDRESS``,
``BROKER_ETCD_PREFIX``, ``CONSUMER_ETCD_PREFIX``, ``DRIFT_INTERVAL`` (seconds).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from typing import Any

import kopf
from prometheus_client import Counter

from gazette.allocator import assignments_from, route_of
from gazette.errors import GazetteError, ValidationError
from gazette.keyspace import BROKER_ROOT, CONSUMER_ROOT, Etcd
from gazette_operator.crds import GROUP, VERSION
from gazette_operator.sync import (
    JOURNAL_KIND,
    SHARD_KIND,
    Conflict,
    Declared,
    SpecWriter,
    declared,
    route_names,
    shard_state,
)

KINDS = {"journalspecs": JOURNAL_KIND, "shardspecs": SHARD_KIND}

WRITES = Counter("gazette_operator_spec_writes_total", "Specs written into etcd", ["kind"])
INVALID = Counter("gazette_operator_invalid_resources_total",
                  "Resources refused by validation (nothing written)", ["kind"])
DRIFTS = Counter("gazette_operator_drift_repairs_total",
                 "Specs changed or removed outside Kubernetes and restored", ["kind"])
ETCD_ERRORS = Counter("gazette_operator_etcd_errors_total", "Failed etcd operations")


class Config:
    """Where etcd is and which prefixes the specs go under (from the environment)."""

    def __init__(self, env: Mapping[str, str] = os.environ) -> None:
        self.etcd_address = env.get("ETCD_ADDRESS", "http://localhost:2379")
        self.broker_root = env.get("BROKER_ETCD_PREFIX", BROKER_ROOT)
        self.consumer_root = env.get("CONSUMER_ETCD_PREFIX", CONSUMER_ROOT)
        self.drift_interval = float(env.get("DRIFT_INTERVAL", "30"))


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


def _declared(resource: str, spec: Mapping[str, Any], memo: Any) -> Declared:
    cfg: Config = memo.config
    return declared(KINDS[resource], dict(spec), cfg.broker_root, cfg.consumer_root)


async def _writer(memo: Any) -> SpecWriter:
    if getattr(memo, "etcd", None) is None:
        memo.etcd = Etcd(memo.config.etcd_address)
        await memo.etcd.connect()
    return SpecWriter(memo.etcd)


async def _startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    if getattr(memo, "config", None) is None:
        memo.config = Config()
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = 20  # INFO and above become Kubernetes events


async def _cleanup(memo: Any, **_: Any) -> None:
    if getattr(memo, "etcd", None) is not None:
        await memo.etcd.close()


async def _sync(**kwargs: Any) -> None:
    resource: str = kwargs["resource"].plural
    body, spec, status = kwargs["body"], kwargs["spec"], kwargs["status"]
    patch, memo, logger = kwargs["patch"], kwargs["memo"], kwargs["logger"]
    generation = kwargs["meta"].get("generation")
    try:
        d = _declared(resource, spec, memo)
    except ValidationError as err:
        _set_status(patch, status,
                    _condition("Ready", False, "InvalidSpec", str(err), generation),
                    observedGeneration=generation)
        kopf.warn(body, reason="InvalidSpec", message=str(err))
        INVALID.labels(resource).inc()
        return  # nothing written; fixed by the next update of the resource
    try:
        writer = await _writer(memo)
        try:
            revision = await writer.write(d, int(status.get("modRevision") or 0))
        except Conflict as conflict:
            # The resource is the truth: an outside change is overwritten, and said so.
            _, revision = await writer.restore(d)
            kopf.warn(body, reason="Drift", message=f"{conflict}: restored the declared spec")
            DRIFTS.labels(resource).inc()
    except (GazetteError, OSError) as err:
        ETCD_ERRORS.inc()
        _set_status(patch, status,
                    _condition("Ready", True, "Valid", "the spec is valid", generation),
                    _condition("Synced", False, "EtcdUnavailable", str(err), generation))
        raise kopf.TemporaryError(f"etcd: {err}", delay=5) from err
    WRITES.labels(resource).inc()
    _set_status(patch, status,
                _condition("Ready", True, "Valid", "the spec is valid", generation),
                _condition("Synced", True, "Written", f"{d.key} at revision {revision}",
                           generation),
                observedGeneration=generation, etcdKey=d.key, modRevision=revision)
    logger.info("%s written to %s at revision %d", d.name, d.key, revision)


async def _delete(**kwargs: Any) -> None:
    status, memo, logger = kwargs["status"], kwargs["memo"], kwargs["logger"]
    key = status.get("etcdKey")
    if not key:
        return  # never written (invalid): nothing to remove
    try:
        writer = await _writer(memo)
        await writer.remove(str(key), 0)
    except (GazetteError, OSError) as err:
        raise kopf.TemporaryError(f"etcd: {err}", delay=5) from err
    logger.info("removed %s", key)


async def _drift(**kwargs: Any) -> None:
    resource: str = kwargs["resource"].plural
    body, spec, status = kwargs["body"], kwargs["spec"], kwargs["status"]
    patch, memo, meta = kwargs["patch"], kwargs["memo"], kwargs["meta"]
    if not status.get("etcdKey"):
        return  # invalid, or not written yet: the create/update handler owns it
    try:
        d = _declared(resource, spec, memo)
        writer = await _writer(memo)
        drifted, revision = await writer.restore(d)
        route = await _route(memo, d)
        state = await _shard_state(memo, d) if resource == "shardspecs" else None
    except ValidationError:
        return
    except (GazetteError, OSError) as err:
        ETCD_ERRORS.inc()
        _set_status(patch, status, _condition("Synced", False, "EtcdUnavailable", str(err),
                                              meta.get("generation")))
        return
    if drifted:
        DRIFTS.labels(resource).inc()
        kopf.warn(body, reason="Drift", message=f"{d.key} was changed or removed outside "
                  f"Kubernetes: restored the declared spec at revision {revision}")
    fields: dict[str, Any] = {"modRevision": revision}
    fields["primary"], fields["replicas"] = route
    if state is not None:
        fields["state"] = state
    _set_status(patch, status, _condition("Synced", True, "Written",
                                          f"{d.key} at revision {revision}",
                                          meta.get("generation")), **fields)


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
