"""The serving shell of a member process (a broker, a consumer member): what every such
process does around the journals or shards it serves.

- `member`: the start and stop sequence (`MemberProcess`: gRPC server and health, etcd,
  the member spec under a lease, supervised tasks, the drain and the stop);
- `options`: each option described once (`Option`), the command line, environment
  fallbacks and the docs' tables made from it;
- `process`: logging, garbage-collector tuning, serving until signalled;
- `grpc_listener`: a member's gRPC server, bound with clear errors;
- `http_listener`: a member's HTTP application and runner (``/metrics`` and ``/healthz``
  open, every other route behind its tokens, idle and malformed connections bounded);
- `malformed_guard`: a service's undecodable request messages refused with
  INVALID_ARGUMENT naming the field.

It sits above `gazette.cluster` (membership, resolving, local items), which does not
import it.
"""
