"""Gazette for Python: the shared library of brokers, consumers, the operator and tools."""

from gazette.errors import GazetteError, ValidationError

__all__ = ["GazetteError", "ValidationError"]
