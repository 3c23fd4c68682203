"""The chart's dashboards and alerts against a real Prometheus scraping a working
cluster: etcd, three brokers (their data path on), two stream-sum consumer members with
recovery logs and hot standbys, a service on the events library (outbox, exactly-once,
dead letters, broadcast), all with mutual TLS as in production, and the operator.
Every dashboard panel's query returns series while the cluster works, every metric an
alert reads exists with the labels it matches on, and the only alert on the working
cluster is the dead letters its service makes on purpose; then real faults (a fragment
store that fails, a shard that fails, a broker SIGKILLed) put their alerts in the
pending (or firing) state from the live scrape."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from gazette.client import JournalClient, RetryPolicy
from gazette.events.outbox import connect
from gazette.keyspace import Etcd, Layout, apply_changes
from gazette.local.process import Process, free_port, log_tail
from gazette.protocol import ShardSource, ShardSpec, SpecChange, journal_changes_from_yaml
from gazette_consumer.examples.stream_sum import APP, SUMS, Driver
from tests.fault.sums import CONSUMERS, Cluster, Load, running_cluster
from tests.fixtures.kube import Emulator
from tests.fixtures.polling import eventually
from tests.fixtures.postgres import PgDatabase
from tests.fixtures.prometheus import ALERTS, Job, Prometheus
from tests.fixtures.promql import (
    alert_rules,
    dashboard_queries,
    grafana_to_promql,
    selectors,
)
from tests.integration.operator.test_operator import create, example
from tests.integration.operator.test_operator_entrypoint import OperatorProcess

pytestmark = pytest.mark.integration

DASHBOARDS = Path(__file__).resolve().parents[2] / "charts/gazette/dashboards"
EVENTS_ROOT = "/gazette/events-ops"
#: A journal whose fragments persist every second: uploads to watch fail.
FLUSHED = "ops/flushed"


def jobs(cluster: Cluster, events_http: int, operator: OperatorProcess) -> list[Job]:
    """Scrape jobs named as the chart's ServiceMonitor names them."""
    sec = cluster.security
    tls = {"ca_file": sec.pki.ca_file, "cert_file": sec.cert.cert_file,
           "key_file": sec.cert.key_file}
    etcd = cluster.etcd.endpoint.removeprefix("https://")
    return [
        Job("gazette-broker", [f"127.0.0.1:{b.http_port}" for b in cluster.brokers],
            "https", tls),
        Job("gazette-consumer", [f"127.0.0.1:{m.http_port}" for m in cluster.members],
            "https", tls),
        Job("gazette-events", [f"127.0.0.1:{events_http}"]),
        Job("gazette-operator", [f"127.0.0.1:{operator.metrics}"]),
        Job("gazette-etcd", [etcd], "https", tls),
    ]


def events_member(cluster: Cluster, dsn: str, http_port: int) -> Process:
    proc = Process("events-ops", [
        sys.executable, "-m", "tests.fault.events_ops_member", cluster.target,
        cluster.etcd.endpoint, dsn, EVENTS_ROOT, str(http_port),
        json.dumps(cluster.security.config())],
        cluster.workdir / "events-ops.log", cwd=Path(__file__).parents[2])
    proc.start()
    return proc


async def empty_queries(prom: Prometheus) -> list[str]:
    """Dashboard panels (and variables) whose query returns no series now."""
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        for title, expr in dashboard_queries(path):
            query = grafana_to_promql(expr)
            if not await asyncio.to_thread(prom.query, query):
                out.append(f"{path.name}: {title}: {query}")
    return out


async def missing_alert_inputs(prom: Prometheus) -> list[str]:
    """Selectors of alert expressions whose metric has no series, or none with the
    labels they match on (the alert could never fire: it reads nothing exported)."""
    out = []
    for name, expr in alert_rules(ALERTS):
        for sel in selectors(expr):
            series = await asyncio.to_thread(prom.query, sel.metric)
            labels = {label for s in series for label in s["metric"]}
            if not series or not sel.labels <= labels:
                out.append(f"{name}: {sel.metric} (labels {sorted(sel.labels - labels)} "
                           f"missing)" if series else f"{name}: {sel.metric}")
    return out


async def alert_seen(prom: Prometheus, name: str, timeout: float = 60) -> None:
    started = time.monotonic()
    await eventually(lambda: name in prom.alert_states(), f"{name} is pending or firing",
                     timeout, interval=0.5)
    print(f"{name}: {prom.alert_states()[name]} after {time.monotonic() - started:.1f}s")


async def test_dashboards_and_alerts_on_a_live_prometheus(
        tmp_path: Path, pg_database: PgDatabase, kube: Emulator, etcd_prefix: str) -> None:
    dsn = pg_database.dsn
    async with await connect(dsn) as conn:
        await conn.execute("CREATE TABLE effects (event_id TEXT NOT NULL, member TEXT)")
    env = dict(os.environ)
    async with running_cluster(tmp_path, broker_http=True, data_path=True,
                               recovery_logs=True, hot_standbys=1) as cluster:
        cluster.member("m0", env)
        cluster.member("m1", env, "zone-b")
        events_http = free_port()
        events = events_member(cluster, dsn, events_http)
        # The operator, against the emulated Kubernetes API and the cluster's etcd
        # (mutual TLS; a prefix of its own).
        sec = cluster.security
        operator = OperatorProcess(kube, cluster.etcd.endpoint, etcd_prefix, tmp_path,
                                   "gazette-operator-0", PEERING_NAME="",
                                   ETCD_CERT_FILE=sec.cert.cert_file,
                                   ETCD_KEY_FILE=sec.cert.key_file,
                                   ETCD_CA_FILE=sec.pki.ca_file)
        await operator.start()
        await create(kube, example())  # a JournalSpec resource it writes into etcd
        scraped = jobs(cluster, events_http, operator)
        prom = Prometheus(tmp_path / "prometheus", scraped)
        retry = RetryPolicy(attempts=100, initial_delay=0.05, max_delay=0.5)
        try:
            async with JournalClient(cluster.target, retry=retry,
                                     auth=cluster.security.client()) as client, \
                    Driver(client, seed=5) as driver, Load(driver, cluster) as load:
                await client.apply(journal_changes_from_yaml(
                    f"name: {FLUSHED}\nreplication: 3\nfragment: {{stores: "
                    f"[\"file:///\"], flush_interval: 1s}}\n"))
                writer = asyncio.create_task(_append_forever(client))
                await load.progress()
                await asyncio.to_thread(prom.start)
                targets = sum(len(j.targets) for j in scraped)

                def all_up() -> bool:
                    health = prom.targets_up()
                    return len(health) == targets and set(health.values()) == {"up"}
                try:
                    await eventually(all_up, "Prometheus scrapes every process", 60, 0.5)
                except AssertionError:
                    raise AssertionError(f"targets not up: {prom.target_errors()}") from None

                # While all is well: every panel shows data, every alert can fire, none does.
                empty: list[str] = []

                async def panels_show_data() -> bool:
                    nonlocal empty
                    empty = await empty_queries(prom)
                    return not empty
                try:
                    await eventually(panels_show_data, "every dashboard query returns "
                                     "series", 90, interval=2)
                except AssertionError:
                    raise AssertionError("panels with no data:\n" + "\n".join(empty)) from None
                # The operator wrote the resource's spec through etcd's mutual TLS.
                written = 'gazette_operator_spec_writes_total{kind="journalspecs"}'
                await eventually(lambda: any(float(s["value"][1]) >= 1 for s in
                                             prom.query(written)),
                                 "the operator wrote a spec", 30, interval=0.5)
                missing = await missing_alert_inputs(prom)
                assert not missing, "alerts reading no series:\n" + "\n".join(missing)
                # The service saves every fifth order as a dead letter: that alert, only.
                await alert_seen(prom, "GazetteEventsDeadLetters")
                assert set(prom.alert_states()) == {"GazetteEventsDeadLetters"}

                # A fragment store that fails: its uploads, then its alert.
                store = cluster.workdir / "store"
                store.rename(cluster.workdir / "store.away")
                store.write_text("not a folder: uploads fail")
                await alert_seen(prom, "GazetteStoreFailing")
                store.unlink()
                (cluster.workdir / "store.away").rename(store)

                # A shard that fails (its source journal does not exist).
                async with Etcd(cluster.etcd.endpoint, tls=cluster.security.etcd_tls) as etcd:
                    await apply_changes(etcd, Layout.consumer_app(APP, CONSUMERS), [
                        SpecChange("ops-broken", 0, ShardSpec(
                            "ops-broken", (ShardSource("ops/no-such-journal"),)))])
                await alert_seen(prom, "GazetteShardFailed")

                # A broker SIGKILLed: its target is down, journals of replication 3 on
                # three brokers are under-replicated.
                await asyncio.to_thread(cluster.brokers[2].kill)
                await alert_seen(prom, "GazetteTargetDown")
                await alert_seen(prom, "GazetteJournalsUnderReplicated")
                # Back: the broker restarts, its journals are whole again, alerts clear.
                cluster.brokers[2].start()
                await eventually(lambda: cluster.journal_ok(SUMS), "the journals have "
                                 "their three brokers again", 60)
                await eventually(lambda: not {"GazetteTargetDown",
                                              "GazetteJournalsUnderReplicated"}
                                 & set(prom.alert_states()), "the broker's alerts cleared",
                                 60, interval=0.5)
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await writer
                await load.finish()
        except BaseException:
            print(f"prometheus log:\n{log_tail(prom.process.log_path, 30)}")
            print(f"events member log:\n{log_tail(events.log_path, 30)}")
            raise
        finally:
            await asyncio.to_thread(prom.stop)
            await asyncio.to_thread(events.stop, 10.0)
            await operator.stop()
            shutil.rmtree(tmp_path / "prometheus", ignore_errors=True)


async def _append_forever(client: JournalClient) -> None:
    """Append to the flushed journal a few times a second (fragments to upload)."""
    n = 0
    while True:
        n += 1
        with contextlib.suppress(Exception):  # faults under way: keep appending
            await client.append(FLUSHED, b'{"n": %d}\n' % n)
        await asyncio.sleep(0.2)
