# All Gazette images: shared stages, one final stage (target) per image. `make images`
# builds all four with the tags the chart pulls (docs/kubernetes.md#images):
#   make images                                   # gazette-{broker,operator,consumer,spark}:<appVersion>
#   make images REGISTRY=ghcr.io/acme PUSH=1      # the same, pushed
# By hand, from the repository root (BuildKit and podman build only the stages a target needs):
#   docker build --target broker -t gazette-broker:0.1.0 .
# Without --target, the last stage (broker) is built.
#
# PYTHON_IMAGE is the base of every stage: python:3.11-slim pinned to Debian bookworm (the
# plain 3.11-slim tag follows Debian's newest release, which has no openjdk-17 for the Spark
# image), or any Debian bookworm image with python3, python3-venv and pip (Debian's own
# Python: /usr/bin/python3, PEP 668), such as the one `make images` makes with debootstrap
# where no registry is reachable. Everything is installed into one virtual environment,
# /opt/gazette, first on PATH: the same layout on both bases, and no system pip touched.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- python: the base with an empty virtual environment.
FROM ${PYTHON_IMAGE} AS python
ENV VIRTUAL_ENV=/opt/gazette \
    PATH=/opt/gazette/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN python3 -m venv /opt/gazette && python -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version'

# --- deps: the distribution's dependencies and the extras its documented applications use
# (PostgreSQL, SQLite on a recovery log, pydantic messages, Iceberg tables) and the build backend, from
# pyproject.toml alone, so
# this layer is rebuilt only when the dependencies change. A build behind a TLS-inspecting
# proxy passes its CA bundle as the secret `pip-cert` (`make images` does); pip's downloads
# are cached across builds in a cache mount, never in the image.
FROM python AS deps
COPY pyproject.toml /src/pyproject.toml
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=pip-cert \
    if [ -s /run/secrets/pip-cert ]; then export PIP_CERT=/run/secrets/pip-cert; fi \
    && python -c 'import tomllib; t = tomllib.load(open("/src/pyproject.toml", "rb")); p = t["project"]; extras = p["optional-dependencies"]; print("\n".join(t["build-system"]["requires"] + p["dependencies"] + [r for e in ("postgres", "sqlite", "apps", "iceberg") for r in extras[e] if not r.startswith("gazette-py")]))' > /src/requirements.txt \
    && pip install --disable-pip-version-check -r /src/requirements.txt

# --- build: the one distribution (pyproject.toml) into the environment. One distribution,
# several package roots: all of them are needed.
FROM deps AS build
WORKDIR /src
COPY README.md ./
COPY proto proto
COPY libs libs
COPY services services
COPY operator operator
COPY spark-jobs spark-jobs
# The build backend came with the dependencies: no download here.
RUN pip install --disable-pip-version-check --no-cache-dir --no-deps --no-build-isolation . \
    && gazette --help >/dev/null && python -m gazette_consumer serve --help >/dev/null

# --- runtime: what the broker, operator and consumer images share. No USER here: the
# targets below still run root steps; each one ends as the non-root user 10001.
FROM python AS runtime
COPY --from=build /opt/gazette /opt/gazette
RUN useradd --system --uid 10001 gazette

# --- operator: `python -m gazette_operator` (JournalSpec/ShardSpec resources into etcd).
FROM runtime AS operator
USER 10001
ENV HEALTH_PORT=8080 METRICS_PORT=9090
EXPOSE 8080 9090
ENTRYPOINT ["python", "-m", "gazette_operator"]

# --- consumer: `python -m gazette_consumer serve`, configured by CONSUMER_MODULE (the
# application, MODULE:ATTR), CONSUMER_APP (its name: its shards live under
# $CONSUMER_ETCD_PREFIX/<name>), BROKER_ADDRESS and ETCD_ADDRESS (or the matching flags;
# see --help). It holds psycopg, apsw and pydantic (SQLStore, SQLiteStore, typed events).
# An application image builds FROM this one and copies its module into /app (the working
# directory, hence on `python -m`'s import path): docs/kubernetes.md#your-application.
FROM runtime AS consumer
# Made here: buildah (podman build) does not create a WORKDIR that no step writes into.
RUN mkdir -p /app
WORKDIR /app
USER 10001
ENV CONSUMER_ETCD_PREFIX=/gazette/consumers
ENTRYPOINT ["python", "-m", "gazette_consumer", "serve"]

# --- spark-deps: the [spark] extra (pyspark, which bundles Spark's jars and spark-submit,
# pyarrow, numpy, pandas) in a stage of its own, so the image's largest layer is rebuilt
# only when these pins change (pyspark is an sdist: pip builds it here).
FROM python AS spark-deps
COPY pyproject.toml /src/pyproject.toml
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=pip-cert \
    if [ -s /run/secrets/pip-cert ]; then export PIP_CERT=/run/secrets/pip-cert; fi \
    && python -c 'import tomllib; print("\n".join(tomllib.load(open("/src/pyproject.toml", "rb"))["project"]["optional-dependencies"]["spark"]))' > /src/spark-requirements.txt \
    && pip install --disable-pip-version-check -r /src/spark-requirements.txt

# --- spark-native: gazette_spark.read's JVM reader (gazette_spark/java), built once with
# a JDK into /opt/gazette/jars; the spark image takes the jar, not the JDK.
FROM python AS spark-native
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jdk-headless \
    && rm -rf /var/lib/apt/lists/*
COPY --from=spark-deps /opt/gazette /opt/gazette
COPY --from=build /opt/gazette /opt/gazette
RUN GAZETTE_SPARK_JARS=/opt/gazette/jars python -c 'from gazette_spark.native import jar; print(jar())'

# --- spark: the Spark job image: Python 3.11, a Java 17 runtime, the [spark] extra and the
# distribution (gazette_spark's jobs), and the native reader's jar.
FROM python AS spark
# Debian installs the JRE in /usr/lib/jvm/java-17-openjdk-<arch> (amd64, arm64, ...): the
# RUN below links that to one architecture-independent path and checks it runs.
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk
# /usr/share/man/man1: slim images drop it, and some JRE post-install scripts expect it.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s "java-17-openjdk-$(dpkg --print-architecture)" "$JAVA_HOME" \
    && "$JAVA_HOME/bin/java" -version
COPY --from=spark-deps /opt/gazette /opt/gazette
COPY --from=build /opt/gazette /opt/gazette
COPY --from=spark-native /opt/gazette/jars /opt/gazette/jars
ENV GAZETTE_SPARK_JARS=/opt/gazette/jars
RUN python -c 'import gazette_spark.source, numpy, pandas, pyarrow, pyspark' \
    && python -c 'from gazette_spark.native import jar; jar()'
# A home directory: Spark writes its warehouse and Ivy cache under the working directory and
# home, and the JVM wants a named user for the uid.
RUN useradd --system --uid 10001 --create-home --home-dir /home/gazette gazette
WORKDIR /home/gazette
USER 10001
# The job is the argument: `docker run gazette-spark -m gazette_spark.<job> ...`. A job is a
# Python module that builds its own SparkSession (pyspark launches the JVM itself, through
# its bundled spark-submit), so plain `python` is the entrypoint: no wrapper between the
# arguments and the job. spark-submit stays on PATH (`--entrypoint spark-submit`).
# SPARK_LOCAL_IP is deliberately unset: the pod's address (or a job's spark.driver.host)
# decides which interface Spark binds.
ENTRYPOINT ["python"]

# --- broker: `gazette serve`. Last, so a plain `docker build .` still builds the broker.
FROM runtime AS broker
RUN mkdir -p /var/spool/gazette && chown gazette /var/spool/gazette
USER 10001
# Large messages land on reused memory instead of freshly faulted pages (docs/broker.md).
ENV GLIBC_TUNABLES=glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824 \
    BROKER_SPOOL_DIR=/var/spool/gazette \
    BROKER_PORT=8080 \
    BROKER_HTTP_PORT=8081 \
    LOG_FORMAT=json
EXPOSE 8080 8081
ENTRYPOINT ["gazette", "serve"]
