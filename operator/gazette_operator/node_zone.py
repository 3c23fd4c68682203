"""``python -m gazette_operator.node_zone``: write the failure zone of the node this pod
runs on to a file, for the broker chart's init container.

The Downward API gives a pod its node's name but not the node's labels, so the pod reads
its ``Node`` from the API server with its service account (RBAC: ``get`` on ``nodes``)
and takes the zone from the node's topology label.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
ZONE_LABEL = "topology.kubernetes.io/zone"


class ZoneError(Exception):
    """The zone could not be found: the message says why."""


def in_cluster_api() -> str:
    """The API server's URL as the kubelet tells every pod."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return f"https://{host}:{port}"


def node_zone(api: str, node: str, *, label: str = ZONE_LABEL, token: str | None = None,
              ca_file: Path | None = None, default: str = "", timeout: float = 10) -> str:
    """The value of `label` on `node`, or `default` when the node has no such label."""
    if not node:
        raise ZoneError("no node name: set --node or $NODE_NAME (the Downward API's "
                        "spec.nodeName)")
    url = f"{api.rstrip('/')}/api/v1/nodes/{urllib.parse.quote(node, safe='')}"
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            labels = json.load(response).get("metadata", {}).get("labels") or {}
    except urllib.error.HTTPError as err:
        hint = " (the service account needs `get` on `nodes`)" if err.code == 403 else ""
        raise ZoneError(f"GET {url}: {err.code} {err.reason}{hint}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise ZoneError(f"GET {url}: {err}") from None
    zone = str(labels.get(label, "")) or default
    if not zone:
        raise ZoneError(f"node {node!r} has no label {label!r} and no --default was given")
    return zone


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gazette_operator.node_zone",
        description="Write the zone of the node this pod runs on (its topology label) to "
                    "a file: the broker's --broker.zone.")
    parser.add_argument("--node", default=os.environ.get("NODE_NAME", ""),
                        help="the node's name [$NODE_NAME]")
    parser.add_argument("--label", default=ZONE_LABEL,
                        help=f"the node label holding the zone (default: {ZONE_LABEL})")
    parser.add_argument("--default", default="",
                        help="zone of a node without the label (default: fail)")
    parser.add_argument("--out", type=Path, required=True, help="file to write the zone to")
    parser.add_argument("--api", default=None,
                        help="API server URL (default: the in-cluster service)")
    parser.add_argument("--service-account", type=Path, default=SERVICE_ACCOUNT,
                        help=f"folder of the token and ca.crt (default: {SERVICE_ACCOUNT})")
    args = parser.parse_args(argv)
    token_file, ca_file = args.service_account / "token", args.service_account / "ca.crt"
    token = token_file.read_text().strip() if token_file.is_file() else None
    api = args.api or in_cluster_api()
    try:
        zone = node_zone(api, args.node, label=args.label, token=token, default=args.default,
                         ca_file=ca_file if api.startswith("https") and ca_file.is_file()
                         else None)
    except ZoneError as err:
        print(f"node_zone: {err}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(zone)
    print(f"node_zone: node {args.node!r} is in zone {zone!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
