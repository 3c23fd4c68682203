"""``python -m gazette_operator`` (the operator image's entrypoint): run the operator.

Environment: ``ETCD_ADDRESS``, ``BROKER_ETCD_PREFIX``, ``CONSUMER_ETCD_PREFIX``,
``OPERATOR_ETCD_PREFIX``, ``DRIFT_INTERVAL``, ``FINALIZER`` (see
`gazette_operator.operator.Config`), ``WATCH_NAMESPACES``
(comma-separated; empty: the whole cluster), ``PEERING_NAME`` and ``PEERING_PRIORITY``
(kopf peering: of several replicas, the live one of the highest priority acts),
``HEALTH_PORT`` (liveness at ``/healthz``, default 8080),
``METRICS_PORT`` (Prometheus, default 9090) and ``LOG_LEVEL`` (default INFO).

Credentials for the Kubernetes API come from the pod's service account, else from
``$KUBECONFIG`` (or ``~/.kube/config``): kopf's own login functions, registered here
because kopf adds them by itself only to its default registry, not to ours (the
credentials found are kept in the memo too, for the API calls the operator makes outside
kopf). Without any, or with a bad environment value, it exits 1 with one line saying
what is wrong.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import secrets
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import kopf
import prometheus_client
import uvloop

from gazette.errors import ValidationError
from gazette_operator.operator import Config, build_registry

DESCRIPTION = """\
The Gazette operator: JournalSpec and ShardSpec custom resources become journal and
shard specs in etcd (validated; written with a revision guard; removed behind a
finalizer when the resource is deleted; drift in etcd repaired on a timer and reported
as an event). Configured by the environment only."""

ENVIRONMENT = """\
environment:
  ETCD_ADDRESS          etcd endpoint (default http://localhost:2379)
  ETCD_CERT_FILE, ETCD_KEY_FILE, ETCD_CA_FILE
                        etcd client TLS: the certificate and key presented to etcd, the CA
                        that verifies it (default: none; an https:// etcd is then verified
                        with the system's CAs)
  BROKER_ETCD_PREFIX    prefix of the broker keyspace, journal specs (default /gazette/cluster)
  CONSUMER_ETCD_PREFIX  prefix of the consumer keyspace, shard specs (default /gazette/consumers)
  OPERATOR_ETCD_PREFIX  prefix of the operator's records of which resource owns which spec
                        (default: BROKER_ETCD_PREFIX followed by -operator)
  DRIFT_INTERVAL        seconds between drift checks of each resource (default 30)
  FINALIZER             the finalizer put on resources (default gazette-py.dev/finalizer);
                        one per operator installation, so two never release each other's
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


_N = TypeVar("_N", int, float)

#: Where kopf's service-account login reads the pod's token.
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def missing_credentials(settings: kopf.OperatorSettings) -> str | None:
    """What is missing when neither of kopf's logins finds credentials, else None.

    Checked with kopf's own login functions before kopf starts: finding none, kopf logs
    about a hundred lines of tracebacks, and none of them says where it looked."""
    try:
        if kopf.login_with_service_account(settings=settings) is not None:
            return None
        account = f"no service account token at {SERVICE_ACCOUNT_TOKEN}"
    except OSError as err:
        account = f"cannot read the service account token {err.filename}: {err.strerror}"
    kubeconfig = os.environ.get("KUBECONFIG")
    where = f"$KUBECONFIG={kubeconfig}" if kubeconfig else "~/.kube/config"
    try:
        if kopf.login_with_kubeconfig(settings=settings) is not None:
            return None
        config = ("no kubeconfig ($KUBECONFIG is unset and "
                  f"{os.path.expanduser('~/.kube/config')} does not exist)")
    except OSError as err:
        config = f"{where}: cannot read {err.filename}: {err.strerror}"
    except Exception as err:  # noqa: BLE001 - malformed: bad YAML, no context, a missing entry
        config = f"{where} is not a usable kubeconfig ({type(err).__name__}: {_one_line(err)})"
    return (f"gazette_operator: no Kubernetes credentials: {account}, and {config}; run it "
            "in a pod with a service account, or set KUBECONFIG to a kubeconfig file")


def _number(env: dict[str, str], name: str, default: str, kind: Callable[[str], _N]) -> _N:
    """`env[name]` as a number; a bad value exits with one line rather than a traceback."""
    raw = env.get(name) or default
    try:
        return kind(raw)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise SystemExit(f"gazette_operator: {name}={raw!r} is not {noun}") from None


def _check_port(name: str, port: int) -> None:
    """Exit with one line if `port` cannot be listened on: kopf would find out only once
    running, and stop with a traceback."""
    if port == 0:
        return
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp does
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as err:
            raise SystemExit(f"gazette_operator: cannot listen on {name}={port}: "
                             f"{err.strerror}") from None


def login_in_cluster(*, settings: kopf.OperatorSettings, **_: Any
                     ) -> kopf.ConnectionInfo | None:
    """kopf's service-account login, at the API server the kubelet names in
    ``KUBERNETES_SERVICE_HOST``/``PORT`` when set (as client-go's in-cluster config does):
    kopf's own assumes ``https://kubernetes.default.svc``, which needs the cluster's DNS
    (not there for a pod with its own DNS policy, nor for the chart run as processes)."""
    info = kopf.login_with_service_account(settings=settings)
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    if info is None or not host:
        return info
    port = os.environ.get("KUBERNETES_SERVICE_PORT") or "443"
    return dataclasses.replace(info, server=f"https://{f'[{host}]' if ':' in host else host}"
                               f":{port}")


def entrypoint_registry(drift_interval: float) -> kopf.OperatorRegistry:
    """`build_registry` plus the login functions: service account, then kubeconfig.

    Their failures are ignored (as kopf does for its own fallbacks): a broken kubeconfig
    must not hold back the service account; if neither gives credentials kopf stops."""
    registry = build_registry(drift_interval)
    kopf.on.login(id="login_with_service_account", errors=kopf.ErrorsMode.IGNORED,
                  registry=registry)(_remembered(login_in_cluster))
    kopf.on.login(id="login_with_kubeconfig", errors=kopf.ErrorsMode.IGNORED,
                  registry=registry)(_remembered(kopf.login_with_kubeconfig))
    return registry


def _remembered(login: Callable[..., kopf.ConnectionInfo | None]
                ) -> Callable[..., kopf.ConnectionInfo | None]:
    """`login`, keeping what it finds in the memo (``memo.connection``): the operator's
    own API calls (namespaces being deleted) use the same credentials."""
    def remembering(memo: Any, **kwargs: Any) -> kopf.ConnectionInfo | None:
        info = login(memo=memo, **kwargs)
        if info is not None and getattr(memo, "connection", None) is None:
            memo.connection = info
        return info
    return remembering


async def run(env: dict[str, str]) -> None:
    _number(env, "DRIFT_INTERVAL", "30", float)
    try:
        config = Config(env)
    except ValidationError as err:
        raise SystemExit(f"gazette_operator: {err}") from None
    namespaces = config.namespaces
    peering = env.get("PEERING_NAME", "gazette-operator")
    # kopf pauses every replica of a tie; a random priority elects one of them.
    priority = _number(env, "PEERING_PRIORITY", str(secrets.randbelow(2**31 - 1) + 1), int)
    health = _number(env, "HEALTH_PORT", "8080", int)
    metrics = _number(env, "METRICS_PORT", "9090", int)
    _check_port("HEALTH_PORT", health)
    try:
        prometheus_client.start_http_server(metrics)
    except OSError as err:
        raise SystemExit(f"gazette_operator: cannot serve metrics on METRICS_PORT={metrics}: "
                         f"{err.strerror}") from None
    await kopf.operator(
        registry=entrypoint_registry(config.drift_interval),
        clusterwide=not namespaces, namespaces=namespaces,
        peering_name=peering or None, standalone=not peering, priority=priority,
        liveness_endpoint=f"http://0.0.0.0:{health}/healthz",
        memo=kopf.Memo(config=config))


def main(argv: Sequence[str] | None = None) -> int:
    parser().parse_args(argv)
    level = os.environ.get("LOG_LEVEL") or "INFO"
    if level.upper() not in logging.getLevelNamesMapping():
        raise SystemExit(f"gazette_operator: LOG_LEVEL={level!r} is not a log level "
                         "(DEBUG, INFO, WARNING or ERROR)")
    logging.basicConfig(level=level.upper(),
                        format="%(asctime)s %(levelname)-5s %(name)s: %(message)s")
    problem = missing_credentials(kopf.OperatorSettings())
    if problem is not None:
        raise SystemExit(problem)
    uvloop.run(run(dict(os.environ)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
