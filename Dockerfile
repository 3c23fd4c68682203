# All Gazette images: one shared build stage, one final stage (target) per image.
# Build from the repository root (BuildKit builds only the stages a target needs):
#   docker build --target broker   -t gazette-broker .
#   docker build --target operator -t gazette-operator .
#   docker build --target consumer -t gazette-consumer .
#   docker build --target spark    -t gazette-spark .
# skaffold: `docker: {dockerfile: Dockerfile, target: <name>}`. Without --target, the last
# stage (broker) is built.
#
# Every stage starts from python:3.11-slim pinned to Debian bookworm: the plain 3.11-slim tag
# follows Debian's newest release (trixie since August 2025), which has no openjdk-17 for the
# Spark image; one base for all stages also means whatever the build stage installs runs on
# the glibc it was built against.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: the one distribution (pyproject.toml) into /install, copied by every image.
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# One distribution, several package roots (see pyproject.toml): all of them are needed.
COPY pyproject.toml README.md ./
COPY proto proto
COPY libs libs
COPY services services
COPY operator operator
COPY spark-jobs spark-jobs
RUN pip install --no-cache-dir --prefix=/install .

# --- runtime: what the broker, operator and consumer images share. No USER here: the
# targets below still run root steps; each one ends as the non-root user 10001.
FROM ${PYTHON_IMAGE} AS runtime
COPY --from=build /install /usr/local
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
# see --help). An application image builds FROM this one and copies its module into /app
# (the working directory, hence on `python -m`'s import path).
FROM runtime AS consumer
WORKDIR /app
USER 10001
ENV CONSUMER_ETCD_PREFIX=/gazette/consumers
ENTRYPOINT ["python", "-m", "gazette_consumer", "serve"]

# --- spark-deps: pyspark (which bundles Spark's jars and spark-submit) and pyarrow, in a
# stage of their own so the image's largest layer is rebuilt only when these pins change
# (pyspark is an sdist: pip builds it here, and only the installed files move on).
FROM ${PYTHON_IMAGE} AS spark-deps
RUN pip install --no-cache-dir --prefix=/install pyspark==4.3.0 pyarrow==26.0.1

# --- spark: the Spark job image: Python 3.11, a Java 17 runtime, pyspark and the
# distribution (gazette_spark's jobs).
FROM ${PYTHON_IMAGE} AS spark
# Debian installs the JRE in /usr/lib/jvm/java-17-openjdk-<arch> (amd64, arm64, ...): the
# RUN below links that to one architecture-independent path and checks it runs.
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk
# /usr/share/man/man1: slim images drop it, and some JRE post-install scripts expect it.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s "java-17-openjdk-$(dpkg --print-architecture)" "$JAVA_HOME" \
    && "$JAVA_HOME/bin/java" -version
COPY --from=spark-deps /install /usr/local
COPY --from=build /install /usr/local
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
