"""Shared fixtures: real etcd, S3 (moto server) and PostgreSQL, each on a free port."""

pytest_plugins = [
    "tests.fixtures.etcd",
    "tests.fixtures.s3",
    "tests.fixtures.postgres",
]
