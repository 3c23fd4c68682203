"""Journals as Iceberg tables, exactly once: `IcebergSink` is a consumer application
whose shards append their committed messages to a table through pyiceberg (a SQL
catalog on SQLite or PostgreSQL), each transaction's rows and the shard's checkpoint in
one catalog commit (`IcebergStore`); `compact` replaces a partition's small files.
See docs/iceberg.md."""

from gazette.iceberg.app import IcebergSink, schema_from_env
from gazette.iceberg.catalog import SharedCatalog, TableConfig, ensure_table
from gazette.iceberg.compact import compact, data_files
from gazette.iceberg.schema import BadValue, Column, Rows, TableSchema
from gazette.iceberg.store import IcebergStore

__all__ = [
    "BadValue",
    "Column",
    "IcebergSink",
    "IcebergStore",
    "Rows",
    "SharedCatalog",
    "TableConfig",
    "TableSchema",
    "compact",
    "data_files",
    "ensure_table",
    "schema_from_env",
]
