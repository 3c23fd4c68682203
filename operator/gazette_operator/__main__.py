"""``python -m gazette_operator`` (the operator image's entrypoint): run the operator.

Environment: ``ETCD_ADDRESS``, ``BROKER_ETCD_PREFIX``, ``CONSUMER_ETCD_PREFIX``,
``DRIFT_INTERVAL`` (see `gazette_operator.operator.Config`), ``WATCH_NAMESPACES``
(comma-separated; empty: the whole cluster), ``PEERING_NAME`` and ``PEERING_PRIORITY``
(kopf peering: of several replicas, the live one of the highest priority acts),
``HEALTH_PORT`` (liveness at ``/healthz``, default 8080),
``METRICS_PORT`` (Prometheus, default 9090) and ``LOG_LEVEL`` (default INFO).

Credentials for the Kubernetes API come from the pod's service account, else from
``$KUBECONFIG`` (or ``~/.kube/config``): kopf's own login functions, registered here
because kopf adds them by itself only to its default registry, not to ours.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys
from collections.abc import Sequence

import kopf
import prometheus_client
import uvloop

from gazette_operator.operator import Config, build_registry

DESCRIPTION = """\
The Gazette operator: JournalSpec and ShardSpec custom resources become journal and
shard specs in etcd (validated; written with a revision guard; removed behind a
finalizer when the resource is deleted; drift in etcd repaired on a timer and reported
as an event). Configured by the environment only."""

ENVIRONMENT = """\
environment:
  ETCD_ADDRESS          etcd endpoint (default http://localhost:2379)
  BROKER_ETCD_PREFIX    prefix of the broker keyspace, journal specs (default /gazette/cluster)
  CONSUMER_ETCD_PREFIX  prefix of the consumer keyspace, shard specs (default /gazette/consumers)
  DRIFT_INTERVAL        seconds between drift checks of each resource (default 30)
  WATCH_NAMESPACES      comma-separated namespaces to watch (default empty: the whole cluster)
  PEERING_NAME          kopf peering object (default gazette-operator): of several replicas
                        one acts at a time. The ClusterKopfPeering (whole cluster) or
                        KopfPeering (per watched namespace) resource of this name must exist;
                        without it kopf keeps the operator paused. Empty: no peering (run
                        one replica only)
  PEERING_PRIORITY      this replica's peering priority: the live replica of the highest
                        acts, the others stand by (default: random, so that no two tie;
                        kopf pauses every replica of a tie)
  HEALTH_PORT           liveness endpoint http://0.0.0.0:PORT/healthz (default 8080)
  METRICS_PORT          Prometheus metrics http://0.0.0.0:PORT/ (default 9090)
  LOG_LEVEL             DEBUG, INFO, WARNING or ERROR (default INFO)

Kubernetes credentials: the pod's service account
(/var/run/secrets/kubernetes.io/serviceaccount), else $KUBECONFIG or ~/.kube/config."""


def parser() -> argparse.ArgumentParser:
    """The command line: ``--help`` only; everything else is in the environment."""
    return argparse.ArgumentParser(
        prog="python -m gazette_operator", description=DESCRIPTION, epilog=ENVIRONMENT,
        formatter_class=argparse.RawDescriptionHelpFormatter)


def entrypoint_registry(drift_interval: float) -> kopf.OperatorRegistry:
    """`build_registry` plus kopf's login functions: service account, then kubeconfig.

    Their failures are ignored (as kopf does for its own fallbacks): a broken kubeconfig
    must not hold back the service account; if neither gives credentials kopf stops."""
    registry = build_registry(drift_interval)
    kopf.on.login(id="login_with_service_account", errors=kopf.ErrorsMode.IGNORED,
                  registry=registry)(kopf.login_with_service_account)
    kopf.on.login(id="login_with_kubeconfig", errors=kopf.ErrorsMode.IGNORED,
                  registry=registry)(kopf.login_with_kubeconfig)
    return registry


async def run(env: dict[str, str]) -> None:
    config = Config(env)
    namespaces = [n for n in env.get("WATCH_NAMESPACES", "").split(",") if n]
    peering = env.get("PEERING_NAME", "gazette-operator")
    # kopf pauses every replica of a tie; a random priority elects one of them.
    try:
        priority = int(env.get("PEERING_PRIORITY") or secrets.randbelow(2**31 - 1) + 1)
    except ValueError:
        raise SystemExit(f"gazette_operator: PEERING_PRIORITY={env['PEERING_PRIORITY']!r} "
                         "is not an integer") from None
    prometheus_client.start_http_server(int(env.get("METRICS_PORT", "9090")))
    await kopf.operator(
        registry=entrypoint_registry(config.drift_interval),
        clusterwide=not namespaces, namespaces=namespaces,
        peering_name=peering or None, standalone=not peering, priority=priority,
        liveness_endpoint=f"http://0.0.0.0:{env.get('HEALTH_PORT', '8080')}/healthz",
        memo=kopf.Memo(config=config))


def main(argv: Sequence[str] | None = None) -> int:
    parser().parse_args(argv)
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO").upper(),
                        format="%(asctime)s %(levelname)-5s %(name)s: %(message)s")
    uvloop.run(run(dict(os.environ)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
