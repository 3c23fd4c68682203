"""``python -m gazette_operator`` (the operator image's entrypoint): run the operator.

Environment: ``ETCD_ADDRESS``, ``BROKER_ETCD_PREFIX``, ``CONSUMER_ETCD_PREFIX``,
``DRIFT_INTERVAL`` (see `gazette_operator.operator.Config`), ``WATCH_NAMESPACES``
(comma-separated; empty: the whole cluster), ``PEERING_NAME`` (kopf peering: of several
replicas, one acts at a time), ``HEALTH_PORT`` (liveness at ``/healthz``, default 8080)
and ``METRICS_PORT`` (Prometheus, default 9090).
"""

from __future__ import annotations

import logging
import os
import sys

import kopf
import prometheus_client
import uvloop

from gazette_operator.operator import Config, build_registry


async def run(env: dict[str, str]) -> None:
    config = Config(env)
    namespaces = [n for n in env.get("WATCH_NAMESPACES", "").split(",") if n]
    prometheus_client.start_http_server(int(env.get("METRICS_PORT", "9090")))
    await kopf.operator(
        registry=build_registry(config.drift_interval),
        clusterwide=not namespaces, namespaces=namespaces,
        peering_name=env.get("PEERING_NAME", "gazette-operator"),
        liveness_endpoint=f"http://0.0.0.0:{env.get('HEALTH_PORT', '8080')}/healthz",
        memo=kopf.Memo(config=config))


def main() -> int:
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO").upper(),
                        format="%(asctime)s %(levelname)-5s %(name)s: %(message)s")
    uvloop.run(run(dict(os.environ)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
