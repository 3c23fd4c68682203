"""What the pages talk to: one journal client of the broker (few retries: a page says at
once that a broker is unreachable), shard clients of consumer members, etcd, and what
the console's token allows. Every call has a deadline (the clients' `timeout`, and each
page's as a whole: `ConsoleConfig.timeout`)."""

from __future__ import annotations

import io
from dataclasses import dataclass

from gazette.auth import Capability
from gazette.client import JournalClient, ListedJournal, RetryPolicy, ShardClient
from gazette.console.config import ConsoleConfig, Resolved
from gazette.console.views import NotFound
from gazette.gazctl.context import Context
from gazette.keyspace import Etcd
from gazette.labels import LabelSet, Selector

#: Retries of a page's calls: an unreachable broker is a page saying so within a second.
QUICK = RetryPolicy(attempts=3, initial_delay=0.1, max_delay=0.5)


@dataclass(frozen=True)
class Grant:
    """What the pages may offer: the token's subject and capabilities, as it says (the
    brokers verify it; the console only hides what would be refused)."""

    subject: str
    capabilities: frozenset[Capability]
    problem: str = ""

    @property
    def read_only(self) -> bool:
        return Capability.APPEND not in self.capabilities


class Backend:
    """The clients of one console, opened once and closed by `close`."""

    def __init__(self, config: ConsoleConfig, resolved: Resolved) -> None:
        self.config, self.resolved = config, resolved
        self.broker = resolved.broker.address
        self.consumer = resolved.consumer.address
        self.client = JournalClient(self.broker, retry=QUICK, timeout=config.timeout,
                                    auth=resolved.auth, data_path=False)
        self.etcd = Etcd(config.etcd_address, timeout=config.timeout,
                         tls=resolved.etcd_tls) if config.etcd_address else None
        self._shards: dict[str, ShardClient] = {}
        claims = resolved.grant
        self.grant = Grant(claims.subject, claims.capabilities) if claims is not None \
            else Grant("", frozenset(), resolved.grant_problem)

    async def open(self) -> None:
        if self.etcd is not None:
            await self.etcd.connect()

    async def close(self) -> None:
        await self.client.close()
        for client in self._shards.values():
            await client.close()
        if self.etcd is not None:
            await self.etcd.close()

    def shards(self, address: str = "") -> ShardClient:
        """A client of the consumer member at `address` (default: --consumer.address);
        only addresses of the config or of member specs in etcd come here."""
        address = address or self.consumer
        client = self._shards.get(address)
        if client is None:
            client = self._shards[address] = ShardClient(
                address, retry=QUICK, timeout=self.config.timeout, auth=self.resolved.auth)
        return client

    def gazctl(self) -> Context:
        """A gazctl context over this console's client, its output kept (gazctl's
        functions are reused as they are)."""
        return Context(self.client, self.client, io.BytesIO(), io.BytesIO(), io.StringIO(),
                       {})

    def allows(self, capabilities: tuple[Capability, ...], labels: LabelSet) -> bool:
        """Whether the token grants `capabilities` over an item with `labels`."""
        claims = self.resolved.grant
        return claims is not None and all(c in claims.capabilities for c in capabilities) \
            and claims.allows(labels)

    async def journal(self, name: str) -> ListedJournal:
        """The listed journal `name` (spec and route); `NotFound` if there is none."""
        listing = await self.client.list(Selector(LabelSet([("name", name)])))
        for journal in listing.journals:
            if journal.spec.name == name:
                return journal
        raise NotFound(f"there is no journal {name!r}", field="journal")
