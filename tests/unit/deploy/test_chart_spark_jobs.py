"""The chart's Spark jobs (sparkJobs), rendered by a real Helm: a local-master Job, a
scheduled CronJob, a k8s-master job with its service account, Role and executor pod
template, and jobs for the Spark operator (SparkApplication and
ScheduledSparkApplication: their required fields, their pod templates) are valid
Kubernetes (kubernetes-validate, strict, offline); their arguments, their S3 credentials
(the brokers' own secret) and the broker address are wired as the jobs expect; the Role
grants only what a Spark driver in client mode asks of the API; the executors' command
passes Spark's settings on (tests/integration/deploy/test_chart_executor_command.py runs
it with the real JRE); bad values are refused."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.fixtures.helm import Helm
from tests.unit.deploy.test_chart import CHART, KUBE_VERSIONS, named, of_kind, render

K8S_MASTER = "k8s://https://kubernetes.default.svc"
BROKER_ADDRESS = "rel-gazette-broker.streaming.svc:8080"
EXPORT_ARGS = ["--journals", "prefix=clicks/, name not in (clicks/part-009)",
               "--broker=$(GAZETTE_BROKER_ADDRESS)", "--output", "s3a://analytics/clicks/"]
WORD_COUNT_ARGS = ["--journals", "prefix=clicks/", "--stores", "s3://journals/",
                   "--output", "s3a://analytics/word-count/"]
EXPORT = {"name": "export-clicks", "job": "export", "args": EXPORT_ARGS,
          "conf": {"spark.sql.shuffle.partitions": 64},
          "resources": {"limits": {"memory": "6Gi"}},
          "ttlSecondsAfterFinished": 3600}
AUDIT = {"name": "nightly-audit", "job": "audit", "schedule": "0 3 * * *",
         "args": ["--journals", "prefix=clicks/", "--stores",
                  '{{ include "gazette.minio.store" . }}']}
WORD_COUNT = {"name": "word-count", "job": "word_count", "master": "k8s",
              "executors": {"instances": 4, "memory": "3g"},
              "env": [{"name": "LOG_LEVEL", "value": "debug"}], "args": WORD_COUNT_ARGS}


def render_jobs(helm: Helm, tmp_path: Path, *jobs: dict[str, Any],
                **values: Any) -> list[dict[str, Any]]:
    """The release with these Spark jobs; the brokers' S3 secret is `broker-s3`."""
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump({"broker": {"s3": {"existingSecret": "broker-s3"}},
                                    "minio": {"enabled": True}, **values,
                                    "sparkJobs": {"jobs": list(jobs)}}))
    return render(helm, file)


def pod_of(o: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a Job or a CronJob."""
    spec = o["spec"]["jobTemplate"]["spec"] if o["kind"] == "CronJob" else o["spec"]
    pod: dict[str, Any] = spec["template"]["spec"]
    return pod


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def confs(args: list[str]) -> dict[str, str]:
    """The --conf key=value arguments, as a dict (every one a pair)."""
    pairs = [args[i + 1] for i, a in enumerate(args) if a == "--conf"]
    assert all("=" in p for p in pairs), pairs
    return dict(p.split("=", 1) for p in pairs)


def broker_s3_env(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    [main] = named(objects, "Deployment", "-broker")["spec"]["template"]["spec"]["containers"]
    return [e for e in main["env"] if e["name"].startswith("AWS_")]


def assert_valid(objects: list[dict[str, Any]]) -> None:
    """Every rendered object, and every executor pod template, is valid Kubernetes."""
    pods = [yaml.safe_load(o["data"]["executor-pod.yaml"])
            for o in of_kind(objects, "ConfigMap") if "executor-pod.yaml" in o.get("data", {})]
    for o in [*objects, *pods]:
        if o["apiVersion"].startswith(("gazette-py.dev/", "kopf.dev/", "apiextensions",
                                       "sparkoperator.k8s.io/")):
            continue  # custom resources and CRDs: their own tests check them
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(o, version, strict=True)
            except kubernetes_validate.ValidationError as err:
                name = o["metadata"].get("name", "executor pod template")
                pytest.fail(f"{o['kind']} {name} (Kubernetes {version}): "
                            f"{'.'.join(map(str, err.path))}: {err.message}")


def test_no_spark_jobs_render_nothing_of_spark(helm: Helm) -> None:
    objects = render(helm, None)
    # (the operator's uninstall hook is a Job of its own)
    assert not [o for o in objects if o["kind"] in ("Job", "CronJob")
                and o["metadata"]["labels"]["app.kubernetes.io/component"] != "uninstall"]
    assert not [o for o in objects if "spark" in o["metadata"]["name"]]


def test_a_local_job_runs_the_module_in_its_pod(helm: Helm, tmp_path: Path) -> None:
    objects = render_jobs(helm, tmp_path, EXPORT)
    assert_valid(objects)
    job = named(objects, "Job", "-spark-export-clicks")
    assert job["metadata"]["name"] == "rel-gazette-spark-export-clicks"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["ttlSecondsAfterFinished"] == 3600
    pod = pod_of(job)
    [main] = pod["containers"]
    assert main["image"] == "gazette-spark:0.1.0"
    # `python` is the image's entrypoint: the module, the job's args as given (a selector
    # with commas and spaces stays one argument), --master, then the job's conf.
    assert main["args"] == ["-m", "gazette_spark.export", *EXPORT_ARGS,
                            "--master", "local[*]",
                            "--conf", "spark.sql.shuffle.partitions=64"]
    # The brokers' S3 settings and secret, and their address for --broker.
    env = env_of(main)
    assert env["GAZETTE_BROKER_ADDRESS"] == BROKER_ADDRESS
    service = named(objects, "Service", "-broker")
    port = service["spec"]["ports"][0]["port"]
    assert env["GAZETTE_BROKER_ADDRESS"] == f"{service['metadata']['name']}.streaming.svc:{port}"
    s3 = [e for e in main["env"] if e["name"].startswith("AWS_")]
    assert s3 == broker_s3_env(objects)
    assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "broker-s3",
                                                         "key": "AWS_ACCESS_KEY_ID"}}
    # No API access: no token, no service account of its own, no RBAC.
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert not [o for o in objects if o["kind"] in ("Role", "RoleBinding", "ServiceAccount")
                and "spark" in o["metadata"]["name"]]
    assert not [o for o in of_kind(objects, "ConfigMap") if "spark" in o["metadata"]["name"]]
    # A retry is a new pod; the job's resources merge over the defaults.
    assert pod["restartPolicy"] == "Never"
    assert main["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"},
                                 "limits": {"memory": "6Gi"}}
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert {m["mountPath"] for m in main["volumeMounts"]} == {"/tmp", "/home/gazette"}


def test_a_schedule_makes_a_cronjob(helm: Helm, tmp_path: Path) -> None:
    objects = render_jobs(helm, tmp_path, {**AUDIT, "suspend": True,
                                           "timeZone": "Etc/UTC"})
    assert_valid(objects)
    assert not [j for j in of_kind(objects, "Job") if "spark" in j["metadata"]["name"]]
    cron = named(objects, "CronJob", "-spark-nightly-audit")
    assert cron["spec"]["schedule"] == "0 3 * * *"
    assert cron["spec"]["suspend"] is True and cron["spec"]["timeZone"] == "Etc/UTC"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    # `kubectl create job --from=cronjob/...` adds at most 11 characters to the name.
    assert len(cron["metadata"]["name"]) <= 52
    [main] = pod_of(cron)["containers"]
    # Args are templates, as journals in values are: here the MinIO bucket's store.
    assert main["args"] == ["-m", "gazette_spark.audit", "--journals", "prefix=clicks/",
                            "--stores",
                            "s3://gazette/",
                            "--master", "local[*]"]
    assert [e for e in main["env"] if e["name"].startswith("AWS_")] == broker_s3_env(objects)


def test_a_k8s_master_job_drives_executor_pods(helm: Helm, tmp_path: Path) -> None:
    objects = render_jobs(helm, tmp_path, WORD_COUNT, EXPORT,
                          image={"registry": "registry.example.com", "tag": "1.2.3"})
    assert_valid(objects)
    job = named(objects, "Job", "-spark-word-count")
    pod = pod_of(job)
    [main] = pod["containers"]
    image = "registry.example.com/gazette-spark:1.2.3"
    assert main["image"] == image
    args = main["args"]
    assert args[:2] == ["-m", "gazette_spark.word_count"]
    assert args[2:2 + len(WORD_COUNT_ARGS)] == WORD_COUNT_ARGS
    assert args[args.index("--master") + 1] == K8S_MASTER
    conf = confs(args)
    assert conf["spark.kubernetes.container.image"] == image
    assert conf["spark.kubernetes.namespace"] == "streaming"
    assert conf["spark.executor.instances"] == "4"
    assert conf["spark.executor.cores"] == "1" and conf["spark.executor.memory"] == "3g"
    # The driver runs in this pod and executors call it at the pod's IP (no Service).
    assert conf["spark.driver.host"] == "$(POD_IP)"
    assert conf["spark.driver.bindAddress"] == "0.0.0.0"
    assert conf["spark.kubernetes.driver.pod.name"] == "$(POD_NAME)"
    env = env_of(main)
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["LOG_LEVEL"] == "debug" and env["GAZETTE_BROKER_ADDRESS"] == BROKER_ADDRESS
    # Its service account, bound to the Role, with a token to call the API.
    account = conf["spark.kubernetes.authenticate.driver.serviceAccountName"]
    assert pod["serviceAccountName"] == account == "rel-gazette-spark"
    assert pod["automountServiceAccountToken"] is True
    assert account in {o["metadata"]["name"] for o in of_kind(objects, "ServiceAccount")}
    [binding] = [b for b in of_kind(objects, "RoleBinding") if "spark" in b["metadata"]["name"]]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                    "namespace": "streaming"}]
    [role] = [r for r in of_kind(objects, "Role") if r["metadata"]["name"] ==
              binding["roleRef"]["name"]]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    assert not any("*" in item for item in granted)
    assert {g for g, _, _ in granted} == {""}
    assert {v for _, r, v in granted if r == "pods"} == {
        "create", "get", "list", "watch", "delete", "deletecollection"}
    assert {v for _, r, v in granted if r == "configmaps"} == {
        "create", "delete", "deletecollection"}
    assert {r for _, r, _ in granted} == {"pods", "configmaps"}
    # ...which is all Spark asks for once the chart turns its Service and PVC clean-up off.
    assert conf["spark.kubernetes.driver.service.deleteOnTermination"] == "false"
    assert conf["spark.kubernetes.driver.ownPersistentVolumeClaim"] == "false"
    assert conf["spark.kubernetes.driver.reusePersistentVolumeClaim"] == "false"
    # The executors' pod template, mounted where the conf says.
    template = Path(conf["spark.kubernetes.executor.podTemplateFile"])
    [mount] = [m for m in main["volumeMounts"] if m["mountPath"] == str(template.parent)]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    config_map = named(objects, "ConfigMap", volume["configMap"]["name"])
    executor = yaml.safe_load(config_map["data"][template.name])
    assert executor["kind"] == "Pod"
    assert executor["spec"]["automountServiceAccountToken"] is False
    [container] = executor["spec"]["containers"]
    assert container["command"][:2] == ["bash", "-c"]
    assert "KubernetesExecutorBackend" in container["command"][2]
    assert [e for e in container["env"] if e["name"].startswith("AWS_")] == (
        broker_s3_env(objects))
    assert env_of(container)["LOG_LEVEL"] == "debug"
    assert container["securityContext"]["runAsNonRoot"] is True
    # The local job beside it has no API access still.
    local = pod_of(named(objects, "Job", "-spark-export-clicks"))
    assert local["automountServiceAccountToken"] is False and "serviceAccountName" not in local


def executor_command(helm: Helm, tmp_path: Path) -> list[str]:
    objects = render_jobs(helm, tmp_path, WORD_COUNT)
    config_map = named(objects, "ConfigMap", "-spark-word-count-executor")
    pod = yaml.safe_load(config_map["data"]["executor-pod.yaml"])
    command: list[str] = pod["spec"]["containers"][0]["command"]
    return command


#: The environment Spark gives an executor pod (BasicExecutorFeatureStep).
SPARK_ENV = {"SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@127.0.0.1:1",
             "SPARK_EXECUTOR_ID": "7", "SPARK_EXECUTOR_CORES": "2",
             "SPARK_APPLICATION_ID": "spark-0123", "SPARK_EXECUTOR_POD_IP": "127.0.0.1",
             "SPARK_RESOURCE_PROFILE_ID": "0", "SPARK_EXECUTOR_POD_NAME": "wc-exec-7",
             "SPARK_EXECUTOR_MEMORY": "256m", "SPARK_JAVA_OPT_0": "-Dspark.driver.port=1",
             "SPARK_JAVA_OPT_1": "-Dspark.app.name=word count"}


def test_the_executor_command_passes_sparks_settings_on(helm: Helm, tmp_path: Path) -> None:
    """The command, run by bash with `java` and `python` stubbed: the JVM options in
    order (one with a space stays one), the memory, pyspark's jars and each setting."""
    command = executor_command(helm, tmp_path)
    bin_dir = tmp_path / "bin"
    (bin_dir / "jdk" / "bin").mkdir(parents=True)
    java = bin_dir / "jdk" / "bin" / "java"
    java.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    python = bin_dir / "python"
    python.write_text("#!/bin/sh\necho /opt/pyspark/jars\n")
    for stub in (java, python):
        stub.chmod(0o755)
    proc = subprocess.run([*command, "executor"], capture_output=True, text=True, check=True,
                          cwd=tmp_path, timeout=30,
                          env={**SPARK_ENV, "PATH": f"{bin_dir}:/usr/bin:/bin",
                               "JAVA_HOME": str(bin_dir / "jdk")})
    assert proc.stdout.splitlines() == [
        "-Dspark.driver.port=1", "-Dspark.app.name=word count", "-Xms256m", "-Xmx256m",
        "-cp", f"/opt/pyspark/jars/*:{tmp_path}",
        "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend",
        "--driver-url", SPARK_ENV["SPARK_DRIVER_URL"], "--executor-id", "7", "--cores", "2",
        "--app-id", "spark-0123", "--hostname", "127.0.0.1", "--resourceProfileId", "0",
        "--podName", "wc-exec-7"]


@pytest.mark.parametrize(("job", "message"), [
    ({"job": "exprt"}, "at '/sparkJobs/jobs/0/job': value must be one of 'export', "
                       "'audit', 'word_count'"),
    ({"schedule": 5}, "at '/sparkJobs/jobs/0/schedule': got number, want string"),
    ({"schedule": "daily"}, "at '/sparkJobs/jobs/0/schedule'"),
    ({"master": "k8s", "executors": {"instances": 0}},
     "at '/sparkJobs/jobs/0/executors/instances': minimum: got 0, want 1"),
    ({"master": "yarn"}, "at '/sparkJobs/jobs/0/master'"),
    ({"name": "Export_Clicks"}, "at '/sparkJobs/jobs/0/name'"),
    ({"name": None}, "at '/sparkJobs/jobs/0': missing property 'name'"),
    ({"args": [["nested"]]}, "at '/sparkJobs/jobs/0/args/0'"),
    ({"executor": {"instances": 2}}, "additional properties 'executor' not allowed"),
    ({"runner": "airflow"}, "at '/sparkJobs/jobs/0/runner'"),
    ({"runner": "spark-operator", "driverMemory": "lots"},
     "at '/sparkJobs/jobs/0/driverMemory'"),
])
def test_bad_spark_values_are_refused_naming_the_key(helm: Helm, tmp_path: Path,
                                                     job: dict[str, Any],
                                                     message: str) -> None:
    item = {k: v for k, v in {**EXPORT, **job}.items() if v is not None}
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump({"sparkJobs": {"jobs": [item]}}))
    proc = helm("template", "rel", CHART, "--values", file, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(("values", "message"), [
    ({"sparkJobs": {"jobs": [EXPORT, {**AUDIT, "name": EXPORT["name"]}]}},
     'sparkJobs.jobs[1]: name "rel-gazette-spark-export-clicks" is taken by sparkJobs.jobs[0]'),
    ({"sparkJobs": {"serviceAccount": {"create": False}, "jobs": [WORD_COUNT]}},
     "sparkJobs.serviceAccount.name: required"),
    ({"sparkJobs": {"defaults": {"executors": {"instances": -1}}}},
     "at '/sparkJobs/defaults/executors/instances'"),
])
def test_conflicting_spark_values_fail(helm: Helm, tmp_path: Path, values: dict[str, Any],
                                       message: str) -> None:
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    proc = helm("template", "rel", CHART, "--values", file, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


#: What a SparkApplication's spec must hold (its CRD, sparkoperator.k8s.io/v1beta2).
SPARK_APPLICATION_REQUIRED = {"driver", "executor", "mainApplicationFile", "sparkVersion",
                              "type"}


def test_a_spark_operator_job_renders_spark_applications(helm: Helm, tmp_path: Path) -> None:
    """runner: spark-operator renders a SparkApplication (a ScheduledSparkApplication
    with a schedule) for the Kubeflow Spark operator: the job's module file in the image
    as its main file, its arguments templated, retries as its restart policy, the driver
    under the service account the Role binds, and pod templates (valid pods) whose
    commands stand in for Spark's entrypoint: the driver's drops the `driver` argument
    Spark gives and runs spark-submit in client mode (run here with a stand-in
    spark-submit that prints what it got)."""
    word_count = {**WORD_COUNT, "runner": "spark-operator", "backoffLimit": 2,
                  "driverMemory": "2g"}
    audit = {**AUDIT, "runner": "spark-operator", "suspend": True}
    objects = render_jobs(helm, tmp_path, word_count, audit, EXPORT)
    assert_valid(objects)
    assert not [o for o in objects if o["metadata"]["name"].endswith(
        ("-spark-word-count", "-spark-nightly-audit")) and o["kind"] in ("Job", "CronJob")]
    named(objects, "Job", "-spark-export-clicks")  # (runner: job, the default)
    app = named(objects, "SparkApplication", "-spark-word-count")
    assert app["apiVersion"] == "sparkoperator.k8s.io/v1beta2"
    spec = app["spec"]
    assert set(spec) >= SPARK_APPLICATION_REQUIRED
    assert (spec["type"], spec["mode"], spec["sparkVersion"]) == ("Python", "cluster", "4.3.0")
    site = "/opt/gazette/lib/python3.11/site-packages"
    assert spec["mainApplicationFile"] == f"local://{site}/gazette_spark/word_count.py"
    assert (CHART.parents[1] / "spark-jobs" / "gazette_spark" / "word_count.py").is_file()
    assert "python3 -m venv /opt/gazette" in (CHART.parents[1] / "Dockerfile").read_text()
    assert spec["arguments"] == WORD_COUNT_ARGS
    assert spec["restartPolicy"] == {"type": "OnFailure", "onFailureRetries": 2,
                                     "onSubmissionFailureRetries": 2}
    driver, executor = spec["driver"], spec["executor"]
    assert driver["memory"] == "2g" and executor == {**executor, "instances": 4,
                                                     "memory": "3g", "cores": 1}
    binding = named(objects, "RoleBinding", "-spark")
    assert binding["subjects"][0]["name"] == driver["serviceAccount"]
    assert env_of(driver)["GAZETTE_BROKER_ADDRESS"] == BROKER_ADDRESS
    assert [e for e in driver["env"] if e["name"].startswith("AWS_")] == broker_s3_env(objects)
    for template in (driver["template"], executor["template"]):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": template.get("metadata", {}),
               "spec": {**template["spec"], "containers": [
                   {"image": "gazette-spark", **c} for c in template["spec"]["containers"]]}}
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(pod, version, strict=True)
    [container] = driver["template"]["spec"]["containers"]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "spark-submit").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (fake / "spark-submit").chmod(0o755)
    spark_args = ["driver", "--properties-file", "/opt/spark/conf/spark.properties",
                  "--class", "org.apache.spark.deploy.PythonRunner",
                  spec["mainApplicationFile"], *spec["arguments"]]
    ran = subprocess.run([*container["command"], *spark_args], capture_output=True,
                         text=True, check=True, timeout=30,
                         env={"PATH": f"{fake}:/usr/bin:/bin",
                              "SPARK_DRIVER_BIND_ADDRESS": "10.1.2.3"})
    assert ran.stdout.splitlines() == ["--conf", "spark.driver.bindAddress=10.1.2.3",
                                       "--deploy-mode", "client", *spark_args[1:]]
    scheduled = named(objects, "ScheduledSparkApplication", "-spark-nightly-audit")
    assert (scheduled["spec"]["schedule"], scheduled["spec"]["suspend"],
            scheduled["spec"]["concurrencyPolicy"]) == ("0 3 * * *", True, "Forbid")
    template = scheduled["spec"]["template"]
    assert set(template) >= SPARK_APPLICATION_REQUIRED
    assert template["restartPolicy"] == {"type": "Never"}
    assert template["arguments"][-1].startswith("s3://")  # (the MinIO store, templated)


def test_the_documented_values_examples_render_valid_jobs(helm: Helm, tmp_path: Path) -> None:
    """Each ```yaml example of docs/spark-on-kubernetes.md, as a values file (with MinIO,
    whose store one of them names), renders valid objects: one Job or CronJob per job."""
    text = (CHART.parents[1] / "docs" / "spark-on-kubernetes.md").read_text()
    examples = [block.split("```")[0] for block in text.split("```yaml\n")[1:]]
    assert len(examples) >= 3
    for i, example in enumerate(examples):
        declared = yaml.safe_load(example)["sparkJobs"]["jobs"]
        values = tmp_path / f"values-{i}.yaml"
        values.write_text(example + "minio: {enabled: true}\n")
        objects = render(helm, values)
        assert_valid(objects)
        for job in declared:
            if job.get("runner") == "spark-operator":
                kind = "ScheduledSparkApplication" if "schedule" in job else \
                    "SparkApplication"
                o = named(objects, kind, f"-spark-{job['name']}")
                spec = o["spec"]["template"] if "schedule" in job else o["spec"]
                assert spec["mainApplicationFile"].endswith(f"gazette_spark/{job['job']}.py")
                continue
            kind = "CronJob" if "schedule" in job else "Job"
            o = named(objects, kind, f"-spark-{job['name']}")
            [main] = pod_of(o)["containers"]
            assert main["args"][:2] == ["-m", f"gazette_spark.{job['job']}"]


def test_a_job_overrides_the_defaults(helm: Helm, tmp_path: Path) -> None:
    """Maps merge key by key; lists, 0 and false replace the defaults' values."""
    defaults = {"backoffLimit": 2, "conf": {"spark.ui.enabled": True, "spark.a": "x"},
                "env": [{"name": "A", "value": "1"}], "nodeSelector": {"pool": "batch"}}
    job = {**EXPORT, "backoffLimit": 0, "conf": {"spark.ui.enabled": False}, "env": []}
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump({"sparkJobs": {"defaults": defaults, "jobs": [job, AUDIT]}}))
    objects = render(helm, file)
    export = named(objects, "Job", "-spark-export-clicks")
    [main] = pod_of(export)["containers"]
    assert export["spec"]["backoffLimit"] == 0
    assert confs(main["args"]) == {"spark.a": "x", "spark.ui.enabled": "false"}
    assert "A" not in env_of(main)
    assert pod_of(export)["nodeSelector"] == {"pool": "batch"}
    audit = named(objects, "CronJob", "-spark-nightly-audit")
    assert audit["spec"]["jobTemplate"]["spec"]["backoffLimit"] == 2
    [main] = pod_of(audit)["containers"]
    assert env_of(main)["A"] == "1"
    assert confs(main["args"]) == {"spark.a": "x", "spark.ui.enabled": "true"}
