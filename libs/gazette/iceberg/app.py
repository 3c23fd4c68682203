"""`IcebergSink`: a consumer application that appends every committed message of its
shards' journals to an Iceberg table, exactly once (`IcebergStore`)::

    GAZETTE_ICEBERG_CATALOG=sqlite:////var/lib/gazette/catalog.db \
    GAZETTE_ICEBERG_WAREHOUSE=file:///var/lib/gazette/warehouse \
    GAZETTE_ICEBERG_TABLE=clicks.events GAZETTE_ICEBERG_COLUMNS="page string, ms long" \
    gazette-consumer serve --app gazette.iceberg:IcebergSink --app-name clicks-table ...

The table's columns are declared (``GAZETTE_ICEBERG_COLUMNS``) or those of an events
topic's model (``GAZETTE_ICEBERG_TOPIC=module:attr``, a `gazette.events.Topic`);
``GAZETTE_ICEBERG_PARTITION`` is hour, day (default), month or none;
``GAZETTE_ICEBERG_BAD_VALUES`` fail (default) or null.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gazette.consumer import Application, Shard, Store
from gazette.errors import ValidationError
from gazette.iceberg.catalog import SharedCatalog, TableConfig
from gazette.iceberg.schema import TableSchema
from gazette.iceberg.store import IcebergStore
from gazette.message import Envelope, Publisher
from gazette.names import load_attr


def schema_from_env(env: Mapping[str, str] | None = None) -> TableSchema:
    """The table's schema from ``GAZETTE_ICEBERG_COLUMNS`` or ``GAZETTE_ICEBERG_TOPIC``."""
    env = os.environ if env is None else env
    partition = env.get("GAZETTE_ICEBERG_PARTITION", "day")
    bad = env.get("GAZETTE_ICEBERG_BAD_VALUES", "fail")
    columns, topic = env.get("GAZETTE_ICEBERG_COLUMNS"), env.get("GAZETTE_ICEBERG_TOPIC")
    if bool(columns) == bool(topic):
        raise ValidationError("GAZETTE_ICEBERG_COLUMNS", "give the table's columns or "
                              "GAZETTE_ICEBERG_TOPIC (module:attr of a topic), one of them")
    if columns:
        return TableSchema.parse(columns, partition, bad)
    found = load_attr(str(topic), "GAZETTE_ICEBERG_TOPIC")
    model = getattr(found, "model", None)
    if not isinstance(model, type):
        raise ValidationError("GAZETTE_ICEBERG_TOPIC", f"{topic!r} is not a Topic")
    return TableSchema.of_model(model, partition, bad)


class IcebergSink(Application):
    """Each committed message of the shards' sources as one row of the table."""

    def __init__(self, config: TableConfig | None = None,
                 schema: TableSchema | None = None) -> None:
        self.config = config or TableConfig.from_env()
        self.schema = schema or schema_from_env()
        self.catalog = SharedCatalog(self.config)

    def new_store(self, shard: Shard) -> Store:
        return IcebergStore(self.config, self.schema, shard.id, catalog=self.catalog)

    def consume_message(self, shard: Shard, store: Any, envelope: Envelope,
                        publisher: Publisher) -> None:
        store.rows.add(envelope.journal, envelope.begin, envelope.uuid, envelope.message)
