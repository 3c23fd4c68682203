"""Journals in Spark: the ``gazette`` PySpark data source and jobs over it.

``gazette_spark.register(spark)`` makes ``spark.read.format("gazette")`` and
``spark.readStream.format("gazette")`` read journals' fragments straight from their stores
(``stores=``) or as a broker lists them (``broker=``). ``gazette_spark.read(spark,
**options)`` takes the same options and has the JVM read what it can (`native`: lines,
at ``spark.read.text``'s speed). The jobs (``python -m gazette_spark.export``,
``.audit``, ``.word_count``) run locally and as Kubernetes Jobs. See docs/spark.md.
"""

from __future__ import annotations

import logging
from typing import Any

from gazette_spark.options import OptionError, ReadOptions
from gazette_spark.plan import DataLoss

__all__ = ["DataLoss", "OptionError", "ReadOptions", "read", "register"]

log = logging.getLogger("gazette_spark")


def register(spark: Any) -> None:
    """Register the ``gazette`` data source with a SparkSession."""
    from gazette_spark.source import GazetteDataSource

    spark.dataSource.register(GazetteDataSource)


def read(spark: Any, reader_schema: Any = None, /, **options: str) -> Any:
    """A DataFrame of the journals `options` select, as ``spark.read.format("gazette")
    .options(**options).load()`` gives (the same rows, columns and errors;
    `reader_schema`: as ``.schema(...)``; the ``schema`` option stays the JSON documents'),
    read by the JVM where it can (framing=lines,
    every codec) and by the ``gazette`` source otherwise (registered here if need be).
    The native path plans here, now: the DataFrame reads the fragments found now each
    time it runs (as Spark's file sources keep the files they listed)."""
    from gazette_spark import native
    from gazette_spark.source import check_schema

    opts = ReadOptions.parse(options)
    given = None
    if reader_schema is not None:
        from pyspark.sql.types import StructType

        given = reader_schema if isinstance(reader_schema, StructType) else \
            StructType.fromDDL(reader_schema)
        if not isinstance(given, StructType):
            raise TypeError(f"reader_schema: {reader_schema!r} is not a struct of columns")
        check_schema(given, opts)
    why = native.natively(opts)
    if not why:
        try:
            native.ensure(spark)
            slices, n = native.plan_json(opts)
        except native.NativeUnavailable as err:
            why = str(err)
    if why:
        log.info("gazette: reading through the Python source: %s", why)
        register(spark)
        reader = spark.read.format("gazette").options(**options)
        return (reader.schema(given) if given is not None else reader).load()
    reader = spark.read.format(native.CLASS).option("slices", slices)
    if given is not None:
        reader = reader.schema(given)
    log.info("gazette: %d partitions read by the JVM (%s)", n, native.CLASS)
    return reader.load()
