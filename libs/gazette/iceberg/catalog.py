"""Where a table lives: a SQL catalog (SQLite or PostgreSQL through SQLAlchemy) and a
warehouse (a folder or an S3 prefix), and the table made or evolved to a `TableSchema`.

pyiceberg is synchronous (SQLAlchemy, file and S3 I/O): everything here runs on a
store's own thread (`IcebergStore`), never on an event loop.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import quote

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.table import Table
from pyiceberg.types import IcebergType, ListType
from sqlalchemy.exc import IntegrityError, OperationalError

from gazette.errors import ValidationError
from gazette.iceberg.schema import TableSchema

T = TypeVar("T")

#: Table properties every table fed from journals has. No commit retries of pyiceberg's
#: own: a retried commit is re-applied to whatever the table became, which would let a
#: shard's fenced-out predecessor commit after all (`IcebergStore` retries, checking
#: its fence first). Old metadata files are deleted as new ones are written.
TABLE_PROPERTIES = {"commit.retry.num-retries": "0",
                    "write.metadata.delete-after-commit.enabled": "true",
                    "write.metadata.previous-versions-max": "20"}
#: A catalog's PostgreSQL sessions: no statement or lock wait without end, and a session
#: left idle inside a transaction (a member frozen mid-commit, holding the table's row)
#: is ended by the server, so the others' commits go on.
POSTGRES_OPTIONS = ("-c statement_timeout=30s -c lock_timeout=5s "
                    "-c idle_in_transaction_session_timeout=10s")
#: Faults of a commit worth retrying: another writer committed first; SQLite's lock.
CONFLICTS = (CommitFailedException, OperationalError)


@dataclass(frozen=True)
class TableConfig:
    """A table `identifier` (``namespace.table``) in the SQL catalog at `uri`
    (``sqlite:////abs/catalog.db``, ``postgresql+psycopg://user@host/db``), data and
    metadata under `warehouse` (``file:///abs/folder``, ``s3://bucket/prefix``);
    `properties`: more of pyiceberg's catalog properties (``s3.endpoint``, ...)."""

    uri: str
    warehouse: str
    identifier: str
    properties: Mapping[str, str] = field(default_factory=dict)
    name: str = "gazette"

    def __post_init__(self) -> None:
        if not self.uri.startswith(("sqlite:", "postgresql")):
            raise ValidationError("catalog uri", f"{self.uri!r} is not a SQLAlchemy URL "
                                  "of SQLite or PostgreSQL (sqlite:////path/catalog.db, "
                                  "postgresql+psycopg://user@host/db)")
        if not self.warehouse.startswith(("file:///", "s3://", "s3a://")):
            raise ValidationError("warehouse", f"{self.warehouse!r} is not file:///abs/"
                                  "path or s3://bucket/prefix")
        parts = self.identifier.split(".")
        if len(parts) != 2 or not all(parts):
            raise ValidationError("table", f"{self.identifier!r} is not namespace.table")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TableConfig:
        """``GAZETTE_ICEBERG_CATALOG``, ``_WAREHOUSE``, ``_TABLE`` and
        ``_PROPERTIES`` (``key=value,key=value``)."""
        env = os.environ if env is None else env
        missing = [f"GAZETTE_ICEBERG_{n}" for n in ("CATALOG", "WAREHOUSE", "TABLE")
                   if not env.get(f"GAZETTE_ICEBERG_{n}")]
        if missing:
            raise ValidationError(missing[0], "is not set")
        props = {}
        for item in filter(None, env.get("GAZETTE_ICEBERG_PROPERTIES", "").split(",")):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ValidationError("GAZETTE_ICEBERG_PROPERTIES",
                                      f"{item!r} is not key=value")
            props[key.strip()] = value.strip()
        return cls(env["GAZETTE_ICEBERG_CATALOG"], env["GAZETTE_ICEBERG_WAREHOUSE"],
                   env["GAZETTE_ICEBERG_TABLE"], props)

    def catalog(self) -> Catalog:
        """The catalog, its calls under deadlines: PostgreSQL sessions get
        `POSTGRES_OPTIONS` (unless the URI gives ``options``), a SQLite file is put in
        WAL mode (readers never wait for a writer)."""
        uri = self.uri
        if uri.startswith("postgresql") and "options=" not in uri:
            uri += ("&" if "?" in uri else "?") + "options=" + quote(POSTGRES_OPTIONS)
        catalog = SqlCatalog(self.name, uri=uri, warehouse=self.warehouse,
                             **dict(self.properties))
        if uri.startswith("sqlite:"):
            with contextlib.suppress(OperationalError), catalog.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")  # (kept by the file)
        return catalog


class SharedCatalog:
    """A process's one catalog of `config` (its SQLAlchemy engine and connection pool),
    made on first use by whichever store's thread asks first."""

    def __init__(self, config: TableConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._catalog: Catalog | None = None

    def __call__(self) -> Catalog:
        with self._lock:
            if self._catalog is None:
                self._catalog = self.config.catalog()
            return self._catalog


def retrying(fn: Callable[[], T], deadline: float, what: str) -> T:
    """`fn()` again, after a short backoff, while it fails on a conflict and time is
    left; a table's catalog CAS (or SQLite's lock) is what it waits out."""
    pause = 0.02
    while True:
        try:
            return fn()
        except CONFLICTS as err:
            if time.monotonic() + pause > deadline:
                raise TimeoutError(f"{what}: still conflicting at the deadline: "
                                   f"{err}") from err
            time.sleep(pause)
            pause = min(pause * 2, 1.0)


def ensure_table(catalog: Catalog, config: TableConfig, schema: TableSchema,
                 deadline: float) -> Table:
    """The table, made if missing (and its namespace), with the schema's new columns
    added if it exists, and `TABLE_PROPERTIES` set."""
    namespace = config.identifier.split(".")[0]

    def load() -> Table:
        try:
            return catalog.load_table(config.identifier)
        except NoSuchTableError:
            pass
        with contextlib.suppress(NamespaceAlreadyExistsError, IntegrityError):
            catalog.create_namespace(namespace)
        wanted = schema.iceberg()
        try:
            return catalog.create_table(config.identifier, schema=wanted,
                                        partition_spec=schema.partition_spec(wanted),
                                        properties=TABLE_PROPERTIES)
        except (TableAlreadyExistsError, IntegrityError):  # (another shard made it first)
            return catalog.load_table(config.identifier)

    table = retrying(load, deadline, f"open table {config.identifier}")

    def evolve() -> Table:
        table.refresh()
        missing = {k: v for k, v in TABLE_PROPERTIES.items()
                   if table.properties.get(k) != v}
        have = {f.name: f.field_type for f in table.schema().fields}
        for f in schema.iceberg().fields:
            if f.name in have and not _same_type(have[f.name], f.field_type):
                raise ValidationError(f"columns.{f.name}", f"is {f.field_type} here but "
                                      f"{have[f.name]} in table {config.identifier}")
        new = [f for f in schema.iceberg().fields if f.name not in have]
        if missing or new:
            with table.transaction() as tx:
                if missing:
                    tx.set_properties(missing)
                if new:
                    with tx.update_schema() as update:
                        for f in new:
                            update.add_column(f.name, f.field_type)
        return table

    return retrying(evolve, deadline, f"evolve table {config.identifier}")


def _same_type(a: IcebergType, b: IcebergType) -> bool:
    """Equal types; lists by their element type (element field ids differ)."""
    if isinstance(a, ListType) and isinstance(b, ListType):
        return _same_type(a.element_type, b.element_type)
    return a == b
