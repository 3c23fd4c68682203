"""The chart's operator, rendered by a real Helm: scoped by release (it watches its own
namespace by default, its peering object and finalizer carry the release's name), its
uninstall hook (a pre-delete Job running `gazette_operator.uninstall` with the operator's
finalizer and namespaces, and only the rights it needs), and values it refuses: a
journal or shard declared twice, three etcd members without persistence, both ways of
choosing namespaces at once."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from gazette_operator import uninstall
from tests.fixtures.helm import Helm
from tests.unit.deploy.test_chart import CHART, assert_valid_kubernetes, named, of_kind

HOOK = "helm.sh/hook"


def template(helm: Helm, release: str, namespace: str, *args: str) -> list[dict[str, Any]]:
    import yaml

    out = helm("template", release, CHART, "--namespace", namespace, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def operator_env(objects: list[dict[str, Any]]) -> dict[str, str]:
    [main] = named(objects, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in main["env"]}


def refused(helm: Helm, *args: str) -> str:
    proc = helm("template", "rel", CHART, *args, check=False)
    assert proc.returncode != 0, "rendered"
    return proc.stderr


def test_two_releases_are_scoped_apart(helm: Helm) -> None:
    """Each release's operator watches its own namespace, peers in its own object and
    puts its own finalizer: a second release neither fails nor touches the first's."""
    seen: dict[str, tuple[str, ...]] = {}
    for release, namespace in (("gazette", "team-a"), ("gazette", "team-b"),
                               ("other", "team-a")):
        objects = template(helm, release, namespace)
        env = operator_env(objects)
        assert env["WATCH_NAMESPACES"] == namespace
        assert env["FINALIZER"] == f"{release}.{namespace}.gazette-py.dev/finalizer"
        assert not of_kind(objects, "ClusterKopfPeering")
        [peering] = of_kind(objects, "KopfPeering")
        assert peering["metadata"]["namespace"] == namespace
        assert peering["metadata"]["name"] == env["PEERING_NAME"]
        roles = [r for r in of_kind(objects, "Role")
                 if r["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"]
        assert [r["metadata"]["namespace"] for r in roles] == [namespace]
        seen[f"{release}/{namespace}"] = (env["PEERING_NAME"], env["FINALIZER"])
    assert len({s[0] for s in seen.values()}) == len({s[1] for s in seen.values()}) == 3
    # Every namespace, on request: a ClusterKopfPeering named per release too.
    names = set()
    for namespace in ("team-a", "team-b"):
        objects = template(helm, "gazette", namespace, "--set",
                           "operator.watchAllNamespaces=true")
        assert operator_env(objects)["WATCH_NAMESPACES"] == ""
        [peering] = of_kind(objects, "ClusterKopfPeering")
        names.add(peering["metadata"]["name"])
    assert len(names) == 2


def test_the_operator_may_read_only_its_namespaces(helm: Helm) -> None:
    """To let go of its finalizer in a namespace being deleted it reads the Namespace
    objects it watches, and nothing more."""
    objects = template(helm, "rel", "streaming", "--set", "operator.watchNamespaces={a,b}")
    [role] = [r for r in of_kind(objects, "ClusterRole")
              if r["metadata"]["name"].endswith("-namespaces")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["namespaces"],
                              "verbs": ["get"], "resourceNames": ["a", "b"]}]
    [binding] = [b for b in of_kind(objects, "ClusterRoleBinding")
                 if b["roleRef"]["name"] == role["metadata"]["name"]]
    account = named(objects, "Deployment", "-operator")["spec"]["template"]["spec"][
        "serviceAccountName"]
    assert binding["subjects"][0]["name"] == account


def hook_objects(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if (o["metadata"].get("annotations") or {}).get(HOOK)]


@pytest.mark.parametrize("watch", [[], ["--set", "operator.watchNamespaces={a,b}"],
                                   ["--set", "operator.watchAllNamespaces=true"]],
                         ids=["own", "listed", "all"])
def test_the_uninstall_hook_runs_before_anything_is_deleted(helm: Helm,
                                                            watch: list[str]) -> None:
    objects = template(helm, "rel", "streaming", *watch)
    hooks = hook_objects(objects)
    assert {o["metadata"]["annotations"][HOOK] for o in hooks} == {"pre-delete"}
    [job] = of_kind(hooks, "Job")
    weights = {o["kind"]: int(o["metadata"]["annotations"]["helm.sh/hook-weight"])
               for o in hooks}
    assert all(w < weights["Job"] for k, w in weights.items() if k != "Job")  # RBAC first
    for o in hooks:
        assert "hook-succeeded" in o["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
        assert_valid_kubernetes(o)
    pod = job["spec"]["template"]["spec"]
    [main] = pod["containers"]
    assert main["command"] == ["python", "-m", "gazette_operator.uninstall"]
    assert importlib.util.find_spec("gazette_operator.uninstall") is not None
    # Its arguments are the operator's own settings, and the program takes them.
    args = uninstall.parser().parse_args(main["args"])
    env = operator_env(objects)
    assert args.finalizer == env["FINALIZER"] and args.namespaces == env["WATCH_NAMESPACES"]
    assert args.deployment == named(objects, "Deployment", "-operator")["metadata"]["name"]
    assert args.selector == "app.kubernetes.io/instance=rel,app.kubernetes.io/component=spec"
    assert main["image"] == named(objects, "Deployment", "-operator")["spec"]["template"][
        "spec"]["containers"][0]["image"]
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.namespace"}}} in main["env"]
    # The resources the chart renders carry the labels the hook selects.
    declared = template(helm, "rel", "streaming", *watch, "--set", "journals[0].name=a/b")
    [journal] = of_kind(declared, "JournalSpec")
    assert uninstall.matches(journal["metadata"]["labels"],
                             uninstall.parse_selector(args.selector))
    # Only the rights it needs, under its own service account.
    assert pod["serviceAccountName"] in {o["metadata"]["name"]
                                         for o in of_kind(hooks, "ServiceAccount")}
    granted = set()
    for role in [*of_kind(hooks, "Role"), *of_kind(hooks, "ClusterRole")]:
        for rule in role["rules"]:
            where = role["metadata"].get("namespace", "*" if role["kind"] == "ClusterRole"
                                         else "streaming")
            for r in rule["resources"]:
                for v in rule["verbs"]:
                    granted.add((where, r, v, tuple(rule.get("resourceNames", ()))))
    namespaces = args.namespaces.split(",") if args.namespaces else ["*"]
    assert granted == {
        *((ns, r, v, ()) for ns in namespaces for r in ("journalspecs", "shardspecs")
          for v in ("get", "list", "delete", "patch")),
        ("streaming", "deployments", "get", ("rel-gazette-operator",)),
        ("streaming", "deployments", "patch", ("rel-gazette-operator",)),
        ("streaming", "pods", "list", ()),
    }


def test_the_uninstall_hook_can_be_turned_off(helm: Helm) -> None:
    objects = template(helm, "rel", "streaming", "--set", "operator.uninstall.enabled=false")
    assert hook_objects(objects) == []
    objects = template(helm, "rel", "streaming", "--set", "operator.enabled=false")
    assert hook_objects(objects) == []


@pytest.mark.parametrize(("args", "messages"), [
    (["--set", "journals[0].name=a/b", "--set", "journals[1].name=c/d",
      "--set", "journals[2].name=a/b", "--set", "journals[2].resourceName=again"],
     ["journals[2]: journal a/b is also declared by journals[0]"]),
    (["--set", "shards[0].app=wc", "--set", "shards[0].id=part-0",
      "--set", "shards[1].app=wc", "--set", "shards[1].id=part-0",
      "--set", "shards[1].resourceName=again"],
     ["shards[1]: shard part-0 of app wc is also declared by shards[0]"]),
    (["--set", "etcd.replicas=3", "--set", "etcd.persistence.enabled=false"],
     ["/etcd/persistence/enabled", "/etcd/replicas"]),
    (["--set", "operator.watchAllNamespaces=true", "--set", "operator.watchNamespaces={a}"],
     ["operator.watchAllNamespaces and operator.watchNamespaces (a) are both set"]),
])
def test_bad_operator_values_fail_naming_them(helm: Helm, args: list[str],
                                              messages: list[str]) -> None:
    err = refused(helm, *args)
    for message in messages:
        assert message in err, err


def test_one_shard_id_in_two_apps_is_two_shards(helm: Helm) -> None:
    objects = template(helm, "rel", "streaming", "--set", "shards[0].app=one",
                       "--set", "shards[0].id=part-0", "--set", "shards[1].app=two",
                       "--set", "shards[1].id=part-0", "--set", "shards[1].resourceName=p2")
    assert len(of_kind(objects, "ShardSpec")) == 2
    # And three etcd members with their volumes render.
    [etcd] = of_kind(template(helm, "rel", "streaming", "--set", "etcd.replicas=3"),
                     "StatefulSet")
    assert etcd["spec"]["replicas"] == 3 and etcd["spec"]["volumeClaimTemplates"]
