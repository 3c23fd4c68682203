"""The consumer member process: ``python -m gazette_consumer serve --app module:App``
runs `gazette.consumer.member.ConsumerMember` over an application (see docs/consumers.md)."""
