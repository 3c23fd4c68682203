"""The broker: journals served over gRPC and HTTP, replicated, persisted to stores.

`BrokerServer` (configured by `BrokerConfig`) is one broker process: what ``gazette
serve`` runs and what tests and ``gazette dev up`` embed. `Broker` turns journal specs
into replicas; `JournalService` is the gRPC service over them. See docs/broker.md.
"""

from gazette_broker.broker import Broker
from gazette_broker.server import BrokerConfig, BrokerServer
from gazette_broker.service import JournalService, add_journal_service

__all__ = ["Broker", "BrokerConfig", "BrokerServer", "JournalService", "add_journal_service"]
