"""Monitoring, checked offline: every metric the dashboards and alerts query is one the
code exports (by the code's own Prometheus registry), with labels it has; every
dashboard query is PromQL (promtool parses it); the dashboards are well-formed; the
chart renders the dashboards' ConfigMaps, the PrometheusRule and the ServiceMonitors or
PodMonitors when asked (wired to the Services, pods and ports they scrape, the
Prometheus operator's objects checked by structure: kubernetes-validate knows no CRDs),
and nothing of it by default; docs/operations.md names real panels and gazctl verbs."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY

from tests.fixtures.helm import Helm
from tests.fixtures.promql import (
    alert_rules,
    dashboard_panels,
    dashboard_queries,
    dashboard_variable_queries,
    grafana_to_promql,
    metric_names,
    promtool,
    selectors,
)
from tests.unit.deploy.test_chart import (
    CHART,
    ROOT,
    VALUES,
    assert_valid_kubernetes,
    of_kind,
    render,
)

DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))
ALERTS = CHART / "files" / "alerts.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"
#: Packages whose modules register the processes' metrics.
PACKAGES = ("gazette", "gazette_broker", "gazette_consumer", "gazette_operator")
#: Metrics that are not ours: Prometheus' own, and etcd's (those of etcd 3.5's /metrics).
FOREIGN = frozenset({
    "up",
    "etcd_server_has_leader", "etcd_server_leader_changes_seen_total",
    "etcd_server_proposals_committed_total", "etcd_server_proposals_failed_total",
    "etcd_server_proposals_pending", "etcd_server_quota_backend_bytes",
    "etcd_mvcc_db_total_size_in_bytes", "etcd_mvcc_db_total_size_in_use_in_bytes",
    "etcd_disk_wal_fsync_duration_seconds_bucket",
    "etcd_disk_backend_commit_duration_seconds_bucket"})
#: Labels every scraped series has, or may have under the Prometheus operator.
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "service", "endpoint",
                           "container"})
#: The sample names of each metric type, from its family's name.
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",),
            "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("", "_sum", "_count", "_created"), "info": ("_info",),
            "stateset": ("",), "unknown": ("",)}
#: Grafana's own variables.
GRAFANA_VARIABLES = frozenset({"__rate_interval", "__interval", "__range"})
MONITORING_ON = ("--set", "monitoring.serviceMonitor.enabled=true",
                 "--set", "monitoring.prometheusRule.enabled=true",
                 "--set", "monitoring.dashboards.enabled=true")
#: How docs/operations.md names a panel: in italics, the dashboard title, U+203A, the panel title.
PANEL_REFERENCE = re.compile("\\*(Gazette / [^*\u203a]+?) \u203a ([^*]+?)\\*")


def metric_modules() -> Iterator[str]:
    """The modules of `PACKAGES` that use prometheus_client (those that register
    metrics), found by their source: a new module is checked without a list to update."""
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, package
        for location in spec.submodule_search_locations:
            root = Path(location)
            for path in sorted(root.rglob("*.py")):
                if path.stem == "__main__" or "prometheus_client" not in path.read_text():
                    continue
                parts = path.relative_to(root).with_suffix("").parts
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                yield ".".join((package, *parts))


def exported_metrics() -> dict[str, frozenset[str]]:
    """Each sample name the processes can export, with its label names (the registry's
    own families, and what its collectors say of their labels)."""
    for module in metric_modules():
        importlib.import_module(module)
    collectors: dict[str, Any] = getattr(REGISTRY, "_names_to_collectors", {})
    known: dict[str, frozenset[str]] = {}
    for family in REGISTRY.collect():
        labels = set(getattr(family, "_labelnames", ()))
        for sample in family.samples:
            labels |= set(sample.labels) - {"le", "quantile"}
        for suffix in SUFFIXES.get(family.type, ("",)):
            name = family.name + suffix
            labels |= set(getattr(collectors.get(name), "_labelnames", ()))
        for suffix in SUFFIXES.get(family.type, ("",)):
            extra = {"le"} if suffix == "_bucket" else set()
            known[family.name + suffix] = frozenset(labels | extra)
    assert "gazette_broker_appends_total" in known, "the metric modules were not imported"
    return known


@pytest.fixture(scope="module")
def exported() -> dict[str, frozenset[str]]:
    return exported_metrics()


def unknown_metrics(where: str, expr: str, known: dict[str, frozenset[str]]) -> list[str]:
    """What `expr` (shown as `where`) selects that the code does not export."""
    problems = []
    for selector in selectors(expr):
        if selector.metric in FOREIGN:
            continue
        if selector.metric not in known:
            problems.append(f"{where}: unknown metric {selector.metric}")
            continue
        wrong = selector.labels - known[selector.metric] - TARGET_LABELS
        if wrong:
            problems.append(f"{where}: {selector.metric} has no label "
                            f"{', '.join(sorted(wrong))} (it has "
                            f"{', '.join(sorted(known[selector.metric])) or 'none'})")
    return problems


def test_the_tokenizer_finds_metrics_not_functions_keywords_or_labels() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, method) (rate(a_bucket{job=~"$job", '
            'code!="x{y}"}[$__rate_interval]))) / on (instance) group_left(store) '
            'max(b_total offset 5m) by (instance) > bool 0 unless {__name__="c", d="e"} '
            'or time() - Inf and count_values("f", g) + [[legacy]] * h[10m:1m] @ start()')
    assert metric_names(expr) == {"a_bucket", "b_total", "c", "g", "h"}
    assert [(s.metric, set(s.labels)) for s in selectors(expr)][:1] == [
        ("a_bucket", {"job", "code"})]


@pytest.mark.parametrize("expr", [
    "gazette_broker_appendz_total",  # a typo
    "rate(gazette_consumer_lag_bytes_bucket[5m])",  # a gauge has no buckets
    'gazette_store_failing{storage="s3://x/"}',  # a label it does not have
])
def test_the_check_catches_what_does_not_exist(
        expr: str, exported: dict[str, frozenset[str]]) -> None:
    problems = unknown_metrics("Panel", expr, exported)
    assert problems and problems[0].startswith("Panel: "), problems


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_every_dashboard_query_names_exported_metrics(
        path: Path, exported: dict[str, frozenset[str]]) -> None:
    queries = [(f"panel {title!r}", expr) for title, expr in dashboard_queries(path)]
    queries += [(f"variable ${name}", expr) for name, expr in dashboard_variable_queries(path)]
    problems = [p for where, expr in queries
                for p in unknown_metrics(f"{path.name} {where}", expr, exported)]
    assert not problems, "\n".join(problems)


def test_every_alert_names_exported_metrics(exported: dict[str, frozenset[str]]) -> None:
    problems = [p for name, expr in alert_rules(ALERTS)
                for p in unknown_metrics(f"{ALERTS.name} alert {name}", expr, exported)]
    assert not problems, "\n".join(problems)


def test_the_dashboards_cover_what_operators_look_at() -> None:
    """Each dashboard queries the metrics of its subject (a panel lost in an edit shows)."""
    used = {path.stem: {m for _, expr in dashboard_queries(path) for m in metric_names(expr)}
            for path in DASHBOARDS}
    assert set(used) == {"gazette-brokers", "gazette-consumers", "gazette-events",
                         "gazette-etcd"}
    expected = {
        "gazette-brokers": {
            "gazette_broker_appends_total", "gazette_broker_append_bytes_total",
            "gazette_broker_read_bytes_total", "gazette_grpc_request_seconds_bucket",
            "gazette_broker_replicated_bytes_total", "gazette_broker_replication_failures_total",
            "gazette_fragments_pending_persist_bytes",
            "gazette_fragments_pending_persist_budget_bytes", "gazette_fragments_persisted_total",
            "gazette_fragment_persist_failures_total", "gazette_store_failing",
            "gazette_task_restarts_total", "gazette_task_failures_total",
            "gazette_forwarded_total"},
        "gazette-consumers": {
            "gazette_consumer_shard_status", "gazette_consumer_lag_bytes",
            "gazette_consumer_lag_seconds", "gazette_consumer_txn_seconds_count",
            "gazette_consumer_txn_seconds_bucket", "gazette_consumer_commit_seconds_bucket",
            "gazette_consumer_messages_total", "gazette_consumer_shard_failures_total",
            "gazette_consumer_shard_restarts_total", "gazette_consumer_recovery_behind_bytes"},
        "gazette-events": {
            "gazette_events_produced_total", "gazette_events_consumed_total",
            "gazette_events_failures_total", "gazette_events_handler_seconds_bucket",
            "gazette_events_outbox_depth", "gazette_events_dead_letters_total",
            "gazette_events_duplicates_total"},
        "gazette-etcd": {
            "gazette_keyspace_revision", "gazette_keyspace_keys",
            "gazette_keyspace_watch_restarts_total", "gazette_leases_lost_total",
            "gazette_leases_overdue_total", "gazette_allocator_converges_total",
            "gazette_allocator_assignment_ops_total", "gazette_cluster_items",
            "etcd_server_has_leader", "etcd_mvcc_db_total_size_in_bytes",
            "etcd_server_proposals_committed_total",
            "etcd_disk_wal_fsync_duration_seconds_bucket"},
    }
    for name, metrics in expected.items():
        assert metrics <= used[name], f"{name} lacks {sorted(metrics - used[name])}"


def test_every_dashboard_query_is_promql(tmp_path: Path) -> None:
    """`promtool check rules` parses each query (Grafana's variables filled in) as the
    expression of a recording rule: a syntax error names the dashboard and panel."""
    rules: list[dict[str, Any]] = []
    for path in DASHBOARDS:
        queries = [*dashboard_queries(path), *dashboard_variable_queries(path)]
        for title, expr in queries:
            rules.append({"record": f"dashboard:check:{len(rules)}",
                          "expr": grafana_to_promql(expr),
                          "labels": {"where": f"{path.name} {title}"}})
    assert len(rules) > 50
    checked = tmp_path / "dashboard-queries.yaml"
    checked.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    proc = subprocess.run([promtool(), "check", "rules", str(checked)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_dashboards_are_well_formed(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    assert dashboard["uid"] == path.stem and dashboard["title"].startswith("Gazette / ")
    assert dashboard["schemaVersion"] == 39 and dashboard["id"] is None
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"job", "instance"} <= set(variables)
    datasource = {"type": "prometheus", "uid": "${datasource}"}
    panels = dashboard_panels(path)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and len(panels) >= 10
    for panel in panels:
        where = f"{path.name} panel {panel['title']!r}"
        assert panel["type"] in ("timeseries", "stat", "table"), where
        assert panel["datasource"] == datasource, where
        assert panel.get("description"), where
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, where
        targets = [t for t in panel["targets"] if t.get("expr")]
        assert targets, f"{where} has no target with an expr"
        for t in targets:
            assert t["datasource"] == datasource, where
            used = {m.group(1) or m.group(2) for m in
                    re.finditer(r"\$\{(\w+)[^}]*\}|\$(\w+)", t["expr"])}
            undefined = used - set(variables) - GRAFANA_VARIABLES
            assert not undefined, f"{where} uses undefined variables {undefined}"
    titles = [p["title"] for p in panels]
    assert len(titles) == len(set(titles)), f"{path.name}: panel titles repeat"


def dashboard_config_maps(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in of_kind(objects, "ConfigMap") if "-dashboard-" in o["metadata"]["name"]]


def pods_of(objects: list[dict[str, Any]], selector: dict[str, str]
            ) -> list[dict[str, Any]]:
    """The pod templates whose labels `selector` matches."""
    return [o["spec"]["template"] for o in objects
            if o["kind"] in ("Deployment", "StatefulSet")
            and selector.items() <= o["spec"]["template"]["metadata"]["labels"].items()]


def container_ports(pod: dict[str, Any]) -> set[str]:
    return {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}


@pytest.mark.parametrize("values", [v for v in VALUES if v != "full"])
def test_monitoring_is_off_by_default(helm: Helm, values: str) -> None:
    """(ci/full-values.yaml turns every feature on, monitoring too.)"""
    objects = render(helm, VALUES[values])
    assert not [o for o in objects if o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert not dashboard_config_maps(objects)
    assert not [o for o in of_kind(objects, "Service")
                if "gazette-py.dev/metrics" in o["metadata"]["labels"]]


def test_monitoring_on_renders_rules_monitors_and_dashboards(helm: Helm) -> None:
    objects = render(helm, None, "--set", "consumer.enabled=true", *MONITORING_ON)
    # The PrometheusRule: files/alerts.yaml as it is.
    [rule] = of_kind(objects, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            keys = set(r)
            assert {"alert", "expr", "labels", "annotations"} <= keys <= {
                "alert", "expr", "for", "labels", "annotations"}, r["alert"]
            assert isinstance(r["expr"], str) and r["labels"]["severity"], r["alert"]
    # The dashboards: a ConfigMap each, for the sidecar, holding the file as it is.
    maps = dashboard_config_maps(objects)
    assert len(maps) == len(DASHBOARDS) == 4
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        [(key, text)] = config_map["data"].items()
        assert json.loads(text) == json.loads((CHART / "dashboards" / key).read_text())
        assert_valid_kubernetes(config_map)
    # A ServiceMonitor per component, each over its own Service.
    monitors = of_kind(objects, "ServiceMonitor")
    jobs = {m["spec"]["endpoints"][0]["relabelings"][0]["replacement"] for m in monitors}
    assert jobs == {"gazette-broker", "gazette-consumer", "gazette-operator", "gazette-etcd"}
    services = of_kind(objects, "Service")
    for monitor in monitors:
        where = monitor["metadata"]["name"]
        selector = monitor["spec"]["selector"]["matchLabels"]
        [service] = [s for s in services
                     if selector.items() <= s["metadata"]["labels"].items()]
        assert_valid_kubernetes(service)
        [endpoint] = monitor["spec"]["endpoints"]
        assert endpoint["path"] == "/metrics" and endpoint["scheme"] == "http", where
        assert endpoint["relabelings"][0]["targetLabel"] == "job", where
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}, where
        [pod] = pods_of(objects, service["spec"]["selector"])
        assert endpoint["port"] in container_ports(pod), where


def test_members_are_scraped_where_they_serve_metrics(helm: Helm) -> None:
    """Brokers and consumer members on their HTTP port (HTTP_PORT env), the operator on
    METRICS_PORT, etcd on its client port, or its metrics listener under etcd.tls."""
    for extra, etcd_port in (((), "client"), (("--set", "etcd.tls.enabled=true",
                                               "--set", "tls.certManager.enabled=true",
                                               "--set", "tls.certManager.issuerRef.name=ca"),
                                              "metrics")):
        objects = render(helm, None, "--set", "consumer.enabled=true",
                         "--set", "monitoring.podMonitor.enabled=true", *extra)
        monitors = of_kind(objects, "PodMonitor")
        assert len(monitors) == 4 and not of_kind(objects, "ServiceMonitor")
        for monitor in monitors:
            [endpoint] = monitor["spec"]["podMetricsEndpoints"]
            job = endpoint["relabelings"][0]["replacement"]
            [pod] = pods_of(objects, monitor["spec"]["selector"]["matchLabels"])
            [container] = pod["spec"]["containers"]
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            number = ports[endpoint["port"]]
            if job in ("gazette-broker", "gazette-consumer"):
                assert endpoint["port"] == "http"
                assert str(number) in (env.get("BROKER_HTTP_PORT"),
                                       env.get("CONSUMER_HTTP_PORT"))
            elif job == "gazette-operator":
                assert env["METRICS_PORT"] == str(number)
            else:
                assert job == "gazette-etcd" and endpoint["port"] == etcd_port
                args = " ".join(container["args"])
                flag = "--listen-metrics-urls" if etcd_port == "metrics" else \
                    "--listen-client-urls"
                assert f"{flag}=http://0.0.0.0:{number}" in args


def test_under_tls_prometheus_checks_members_as_their_certificates_say(helm: Helm) -> None:
    objects = render(helm, VALUES["secure"], "--set", "monitoring.serviceMonitor.enabled=true")
    certificates = {c["spec"]["secretName"]: c["spec"] for c in of_kind(objects, "Certificate")}
    members = 0
    for monitor in of_kind(objects, "ServiceMonitor"):
        [endpoint] = monitor["spec"]["endpoints"]
        if endpoint["relabelings"][0]["replacement"] not in ("gazette-broker",
                                                               "gazette-consumer"):
            assert endpoint["scheme"] == "http"  # the operator, etcd's metrics listener
            continue
        members += 1
        tls = endpoint["tlsConfig"]
        assert endpoint["scheme"] == "https"
        secret = tls["ca"]["secret"]["name"]
        assert tls["serverName"] in certificates[secret]["dnsNames"]
        # Mutual TLS: the member's own certificate, which has client auth.
        assert tls["cert"]["secret"]["name"] == tls["keySecret"]["name"] == secret
        assert "client auth" in certificates[secret]["usages"]
    assert members == 2
    # A tlsConfig of one's own replaces it.
    own = render(helm, VALUES["secure"], "--set", "monitoring.serviceMonitor.enabled=true",
                 "--set", "monitoring.serviceMonitor.tlsConfig.insecureSkipVerify=true")
    configs = [m["spec"]["endpoints"][0].get("tlsConfig") for m in of_kind(own, "ServiceMonitor")]
    assert configs.count({"insecureSkipVerify": True}) == 2


def test_monitoring_values_are_applied(helm: Helm) -> None:
    objects = render(
        helm, None, *MONITORING_ON,
        "--set", "monitoring.serviceMonitor.labels.release=kube-prometheus-stack",
        "--set", "monitoring.serviceMonitor.interval=15s",
        "--set", "monitoring.serviceMonitor.scrapeTimeout=10s",
        "--set", "monitoring.prometheusRule.labels.release=kube-prometheus-stack",
        "--set", "monitoring.prometheusRule.additionalRuleLabels.team=streaming",
        "--set", "monitoring.prometheusRule.additionalRuleLabels.severity=page",
        "--set", "monitoring.prometheusRule.disabled[0]=GazetteConsumerLagHigh",
        "--set", "monitoring.dashboards.label=grafana.example.com/dashboard",
        "--set", "monitoring.dashboards.labelValue=gazette",
        "--set", "monitoring.dashboards.namespace=monitoring",
        "--set", "monitoring.dashboards.annotations.grafana_folder=Gazette")
    for monitor in of_kind(objects, "ServiceMonitor"):
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        [endpoint] = monitor["spec"]["endpoints"]
        assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("15s", "10s")
    [rule] = of_kind(objects, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert len(rules) == len(alert_rules(ALERTS)) - 1
    assert "GazetteConsumerLagHigh" not in {r["alert"] for r in rules}
    for r in rules:  # added labels, under the rule's own
        assert r["labels"]["team"] == "streaming" and r["labels"]["severity"] != "page"
    for config_map in dashboard_config_maps(objects):
        meta = config_map["metadata"]
        assert meta["labels"]["grafana.example.com/dashboard"] == "gazette"
        assert meta["namespace"] == "monitoring"
        assert meta["annotations"] == {"grafana_folder": "Gazette"}
        assert_valid_kubernetes(config_map)


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "monitoring.serviceMonitor.enabled=true",
      "--set", "monitoring.podMonitor.enabled=true"], "choose one"),
    (["--set", "monitoring.prometheusRule.enabled=true",
      "--set", "monitoring.prometheusRule.disabled[0]=GazetteNoSuchAlert"],
     "no alert is named GazetteNoSuchAlert"),
    (["--set", "monitoring.serviceMonitor.interval=often"], "/monitoring/serviceMonitor/interval"),
    (["--set", "monitoring.dashbords.enabled=true"], "'dashbords' not allowed"),
])
def test_bad_monitoring_values_fail_naming_the_key(helm: Helm, args: list[str],
                                                   message: str) -> None:
    proc = helm("template", "rel", CHART, *args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_helm_lint_passes_with_monitoring_on(helm: Helm) -> None:
    full = VALUES["full"]
    assert full is not None
    proc = helm("lint", "--strict", CHART, "--values", full, *MONITORING_ON)
    assert "0 chart(s) failed" in proc.stdout


def panel_titles() -> dict[str, set[str]]:
    return {json.loads(p.read_text())["title"]: {panel["title"] for panel in dashboard_panels(p)}
            for p in DASHBOARDS}


def test_the_runbooks_name_real_panels_and_gazctl_commands() -> None:
    """docs/operations.md points at panels by dashboard and panel title, and gives gazctl
    command lines: each panel must exist and each line parse, so a renamed panel, verb or
    flag shows here."""
    from gazette.gazctl.__main__ import build_parser

    text = OPERATIONS.read_text()
    titles = panel_titles()
    references = [(" ".join(d.split()), " ".join(p.split()))  # wrapped lines: one space
                  for d, p in re.findall(PANEL_REFERENCE, text)]
    assert len(references) >= 15
    for dashboard, panel in references:
        assert dashboard in titles, f"docs/operations.md: no dashboard {dashboard!r}"
        assert panel in titles[dashboard], \
            f"docs/operations.md: {dashboard!r} has no panel {panel!r}"
    commands = re.findall(r"`(gazctl [^`]+)`", " ".join(text.split()))
    assert len(commands) >= 10
    for command in commands:
        argv = re.sub(r"<[^>]+>", "x", command).split()[1:]  # <shard>: any value
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"docs/operations.md: `{command}` is not a gazctl command line")
