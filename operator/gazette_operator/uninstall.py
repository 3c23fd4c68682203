"""``python -m gazette_operator.uninstall``: the chart's pre-delete hook.

Helm deletes a release's operator, its etcd and its JournalSpec/ShardSpec resources
together; the resources' finalizer can only be removed by the operator, so they would
stay Terminating for ever (and the namespace with them). Run before anything is deleted,
while the operator still runs, this:

1. deletes the release's own resources (``--selector``), so the operator removes their
   specs from etcd and releases them, and waits for them to go (``--timeout``);
2. scales the operator's Deployment (``--deployment``) to zero and waits until its pods
   are gone, so nothing puts the finalizer back;
3. drops the release's finalizer (``--finalizer``) from every resource in the watched
   namespaces that still carries it: resources created outside the chart (they stay,
   and their specs stay in etcd's volume: a later install takes them over), and any the
   operator did not release in time (it says which).

It exits 0 even then, so that ``helm uninstall`` goes on; 1 with one line for bad
arguments or missing credentials.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Sequence

import kopf

from gazette_operator.kube import (
    PLURALS,
    KubeApi,
    KubeError,
    drop_finalizer,
    holding,
    path_of,
    resources_path,
)

log = logging.getLogger("gazette_operator.uninstall")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gazette_operator.uninstall",
        description="Before a release is uninstalled: delete its JournalSpec and ShardSpec "
                    "resources while its operator still runs, wait for them to go, then "
                    "drop its finalizer from whatever resource still carries it.")
    p.add_argument("--selector", required=True, metavar="LABELS",
                   help="label selector of the release's own resources, e.g. "
                        "app.kubernetes.io/instance=gazette,app.kubernetes.io/component=spec")
    p.add_argument("--namespaces", default=os.environ.get("WATCH_NAMESPACES", ""),
                   metavar="NS,NS",
                   help="namespaces the operator watches [$WATCH_NAMESPACES] "
                        "(empty: every namespace)")
    p.add_argument("--finalizer", default=os.environ.get("FINALIZER", ""),
                   metavar="NAME", help="the release's finalizer [$FINALIZER]")
    p.add_argument("--deployment", default="", metavar="NAME",
                   help="the operator's Deployment, scaled to zero before finalizers are "
                        "dropped (empty: none; nothing then stops it putting them back)")
    p.add_argument("--deployment-namespace", default=os.environ.get("POD_NAMESPACE", ""),
                   metavar="NS", help="its namespace [$POD_NAMESPACE]")
    p.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                   help="how long to wait for the operator to release the resources, and "
                        "again for it to stop (default 120)")
    return p


Requirement = tuple[str, str, str]  # (key, operator: "=", "!=", "exists", "!exists", value)


def parse_selector(text: str) -> list[Requirement]:
    """An equality-based label selector (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``,
    comma-separated); ValueError naming the part it cannot read."""
    out: list[Requirement] = []
    for part in (p.strip() for p in text.split(",")):
        if "!=" in part:
            key, _, value = part.partition("!=")
            out.append((key.strip(), "!=", value.strip()))
        elif "=" in part:
            key, _, value = part.replace("==", "=").partition("=")
            out.append((key.strip(), "=", value.strip()))
        elif part.startswith("!"):
            out.append((part[1:].strip(), "!exists", ""))
        else:
            out.append((part, "exists", ""))
        if not out[-1][0] or " " in out[-1][0] or "(" in part:
            raise ValueError(f"--selector: cannot read {part!r} (use key=value, key!=value, "
                             "key or !key, comma-separated)")
    return out


def matches(labels: dict[str, str], selector: list[Requirement]) -> bool:
    """Whether `labels` satisfy every requirement (checked here too: the API server
    filters by ``labelSelector``, and this does not depend on it)."""
    for key, op, value in selector:
        ok = {"=": labels.get(key) == value, "!=": labels.get(key) != value,
              "exists": key in labels, "!exists": key not in labels}[op]
        if not ok:
            return False
    return True


async def delete_release_resources(api: KubeApi, namespaces: list[str], selector: str
                                   ) -> list[str]:
    """Delete the resources of `selector`; the API paths of those deleted."""
    wanted = parse_selector(selector)
    paths = []
    for namespace in namespaces or [""]:
        for plural in PLURALS:
            for obj in await api.items(resources_path(plural, namespace), selector):
                if not matches(dict(obj["metadata"].get("labels") or {}), wanted):
                    continue
                path = path_of(obj, plural)
                if await api.delete(path):
                    paths.append(path)
    return paths


async def wait_gone(api: KubeApi, paths: list[str], timeout: float) -> list[str]:
    """Poll until every one of `paths` is gone, at most `timeout` seconds; those left."""
    deadline = time.monotonic() + timeout
    left = list(paths)
    while left:
        left = [p for p in left if await api.get(p) is not None]
        if not left or time.monotonic() > deadline:
            break
        await asyncio.sleep(1)
    return left


async def stop_operator(api: KubeApi, namespace: str, name: str, timeout: float) -> bool:
    """Scale the Deployment to zero and wait until none of its pods is left; whether
    they went in time (an absent Deployment: nothing to stop)."""
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"
    deployment = await api.get(path)
    if deployment is None:
        return True
    await api.json_patch(path, [{"op": "replace", "path": "/spec/replicas", "value": 0}])
    labels = deployment.get("spec", {}).get("selector", {}).get("matchLabels") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    wanted = parse_selector(selector) if selector else []
    deadline = time.monotonic() + timeout
    while True:
        pods = [p for p in await api.items(f"/api/v1/namespaces/{namespace}/pods", selector)
                if matches(dict(p.get("metadata", {}).get("labels") or {}), wanted)]
        if not pods:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(1)


async def uninstall(api: KubeApi, namespaces: list[str], selector: str, finalizer: str,
                    timeout: float, deployment: tuple[str, str] | None = None) -> list[str]:
    """The hook's work; the resources whose finalizer had to be dropped (ns/name).
    `deployment`: the operator's (namespace, name)."""
    deleted = await delete_release_resources(api, namespaces, selector)
    log.info("deleted %d resources of the release; waiting for the operator to remove "
             "their specs", len(deleted))
    left = await wait_gone(api, deleted, timeout)
    if left:
        log.warning("the operator did not release %s within %gs: their specs may stay in "
                    "etcd", ", ".join(left), timeout)
    if deployment is not None:
        if await stop_operator(api, *deployment, timeout):
            log.info("the operator (%s/%s) is stopped", *deployment)
        else:
            log.warning("the operator's pods (%s/%s) are still there after %gs: it may "
                        "put its finalizer back", *deployment, timeout)
    dropped = []
    for plural, obj in await holding(api, namespaces, finalizer):
        if await drop_finalizer(api, obj, plural, finalizer):
            dropped.append(f"{obj['metadata']['namespace']}/{obj['metadata']['name']}")
    if dropped:
        log.info("dropped the finalizer %s from %s (no operator will remove it once "
                 "the release is gone)", finalizer, ", ".join(dropped))
    return dropped


def credentials() -> kopf.ConnectionInfo:
    """The pod's service account, else the kubeconfig; exit 1 with one line if none."""
    from gazette_operator.__main__ import login_in_cluster  # the operator's own login

    settings = kopf.OperatorSettings()
    for login in (login_in_cluster, kopf.login_with_kubeconfig):
        try:
            info = login(settings=settings)
        except Exception as err:  # noqa: BLE001 - an unusable kubeconfig: try no further
            raise SystemExit(f"gazette_operator.uninstall: no usable Kubernetes "
                             f"credentials: {type(err).__name__}: {err}") from None
        if info is not None:
            return info
    raise SystemExit("gazette_operator.uninstall: no Kubernetes credentials: no service "
                     "account token, and no kubeconfig ($KUBECONFIG or ~/.kube/config)")


async def run(args: argparse.Namespace, info: kopf.ConnectionInfo) -> int:
    namespaces = [n.strip() for n in args.namespaces.split(",") if n.strip()]
    async with KubeApi(info) as api:
        try:
            deployment = (args.deployment_namespace, args.deployment) \
                if args.deployment else None
            await uninstall(api, namespaces, args.selector, args.finalizer, args.timeout,
                            deployment)
        except KubeError as err:
            raise SystemExit(f"gazette_operator.uninstall: {err}") from None
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.finalizer:
        raise SystemExit("gazette_operator.uninstall: --finalizer (or $FINALIZER) is "
                         "required: the finalizer the release's operator puts on resources")
    try:
        parse_selector(args.selector)
    except ValueError as err:
        raise SystemExit(f"gazette_operator.uninstall: {err}") from None
    if args.deployment and not args.deployment_namespace:
        raise SystemExit("gazette_operator.uninstall: --deployment needs "
                         "--deployment-namespace (or $POD_NAMESPACE)")
    if args.timeout <= 0:
        raise SystemExit(f"gazette_operator.uninstall: --timeout must be positive, got "
                         f"{args.timeout:g}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-5s %(message)s")
    return asyncio.run(run(args, credentials()))


if __name__ == "__main__":
    sys.exit(main())
