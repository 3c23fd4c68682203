"""Journals in Spark: the ``gazette`` PySpark data source and jobs over it.

``gazette_spark.register(spark)`` makes ``spark.read.format("gazette")`` and
``spark.readStream.format("gazette")`` read journals' fragments straight from their stores
(``stores=``) or as a broker lists them (``broker=``). The jobs (``python -m
gazette_spark.export``, ``.audit``, ``.word_count``) run locally and as Kubernetes Jobs.
See docs/spark.md.
"""

from __future__ import annotations

from typing import Any

from gazette_spark.options import OptionError, ReadOptions
from gazette_spark.plan import DataLoss

__all__ = ["DataLoss", "OptionError", "ReadOptions", "register"]


def register(spark: Any) -> None:
    """Register the ``gazette`` data source with a SparkSession."""
    from gazette_spark.source import GazetteDataSource

    spark.dataSource.register(GazetteDataSource)
