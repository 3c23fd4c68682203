"""An application of our own, in an image built FROM gazette-consumer (Dockerfile beside
it): the word-count example, with the consumer image's extras imported to prove they are
there (psycopg for SQLStore, apsw for SQLiteStore, pydantic for typed events)."""

import apsw  # noqa: F401
import psycopg  # noqa: F401
import pydantic  # noqa: F401

from gazette_consumer.examples.word_count import WordCount

__all__ = ["WordCount"]
