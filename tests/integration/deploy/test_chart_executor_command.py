"""The executor pods of the chart's k8s-master Spark jobs start from a pod template whose
command replaces the spark image's `python` entrypoint. Run here with the real pyspark
and Java runtime and the environment Spark gives an executor pod: Spark's executor
backend starts, takes every argument, and calls the driver (nobody listens here)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.fixtures.helm import Helm
from tests.unit.deploy.test_chart_spark_jobs import SPARK_ENV, executor_command

pytestmark = pytest.mark.integration


def test_the_executor_command_starts_sparks_executor_backend(helm: Helm,
                                                             tmp_path: Path) -> None:
    pyspark = importlib.util.find_spec("pyspark")
    java = shutil.which("java")
    if pyspark is None or pyspark.origin is None or java is None:
        pytest.fail("needs pyspark (the dev extra: make test installs it) and a Java runtime "
                    "(openjdk-17-jre-headless; scripts/ensure-system-deps.sh)", pytrace=False)
    jars = Path(pyspark.origin).parent / "jars"
    [k8s_jar] = jars.glob("spark-kubernetes_*.jar")
    assert ("org/apache/spark/scheduler/cluster/k8s/KubernetesExecutorBackend.class"
            in zipfile.ZipFile(k8s_jar).namelist())
    command = executor_command(helm, tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # `python` on the PATH is the image's; here, this interpreter (with pyspark).
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    java_home = Path(os.path.realpath(java)).parent.parent
    proc = subprocess.run([*command, "executor"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, check=False,
                          env={**SPARK_ENV, "PATH": f"{bin_dir}:/usr/bin:/bin",
                               "HOME": str(tmp_path), "JAVA_HOME": str(java_home),
                               "EXECUTOR_DRIVER_PROPS_FETCHER_MAX_ATTEMPTS": "1"})
    assert proc.returncode != 0
    assert "KubernetesExecutorBackend: Started daemon" in proc.stderr, proc.stderr
    assert "Failed to connect to /127.0.0.1:1" in proc.stderr, proc.stderr
    assert "Usage" not in proc.stderr
