"""NDJSON framing throughput with about 1 KiB JSON messages.

Figures (messages/s, median of 3 runs):
- ``ndjson_decode_msgs_per_s``: `NdjsonFraming.decode` of a journal's bytes into
  `JsonMessage` frames with offsets and checked UUIDs, fed in 1 MiB reads the way a
  reader does (the incomplete last line carried over to the next read; the buffers are
  prepared beforehand, so only `decode` is timed);
- ``ndjson_decode_one_buffer_msgs_per_s``: the same bytes decoded in one call;
- ``ndjson_encode_msgs_per_s``: `NdjsonFraming.encode` of batches of 1,000 messages;
- ceilings measured in the same run: msgspec's bare ``decode_lines`` into dicts and
  ``encode_lines`` of dicts.

`measure_ndjson_decode` and `measure_ndjson_encode` are importable.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable

import msgspec

from gazette.message import JsonMessage
from gazette.message import uuid as uuids
from gazette.message.framing import NdjsonFraming

N_MESSAGES = 100_000
BATCH = 1_000
READ_SIZE = 1 << 20
RUNS = 3


def make_messages(n: int = N_MESSAGES) -> list[JsonMessage]:
    """About 1 KiB each: a UUID, a few short fields and a ~900-byte string."""
    producer = uuids.new_producer_id()
    clock = uuids.Clock()
    clock.update()
    body = ("lorem ipsum dolor sit amet, " * 40)[:900]
    out = []
    for i in range(n):
        msg = JsonMessage(user=f"user-{i % 977}", page=f"/p/{i % 31}", count=i, ok=i % 2 == 0,
                          body=body)
        msg.set_uuid(uuids.build(producer, clock.tick(), uuids.Flags.OUTSIDE_TXN))
        out.append(msg)
    return out


def _median_rate(n: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return n / statistics.median(times)


def reads(data: bytes, size: int = READ_SIZE) -> list[tuple[bytes, bool]]:
    """The buffers a reader decodes when it reads `data` in `size` reads: each read
    appended to the incomplete line left over from the previous one."""
    out = []
    carry = b""
    for offset in range(0, len(data), size):
        buf = carry + data[offset:offset + size]
        carry = buf[buf.rfind(b"\n") + 1:]
        out.append((buf, False))
    out.append((carry, True))
    return out


def _decode_all(framing: NdjsonFraming, buffers: list[tuple[bytes, bool]]) -> int:
    count = 0
    for buf, final in buffers:
        frames, _ = framing.decode(buf, final)
        count += len(frames)
    return count


def measure_ndjson_decode(n: int = N_MESSAGES) -> float:
    """Messages/s decoded from 1 MiB reads into JsonMessage frames with offsets (the
    time of `decode` calls only: the reads are prepared beforehand)."""
    framing = NdjsonFraming()
    buffers = reads(framing.encode(make_messages(n)))
    assert _decode_all(framing, buffers) == n
    return _median_rate(n, lambda: _decode_all(framing, buffers))


def measure_ndjson_decode_one_buffer(n: int = N_MESSAGES) -> float:
    framing = NdjsonFraming()
    data = framing.encode(make_messages(n))
    return _median_rate(n, lambda: framing.decode(data))


def measure_ndjson_encode(n: int = N_MESSAGES) -> float:
    """Messages/s encoded by NdjsonFraming.encode in batches of 1,000."""
    framing = NdjsonFraming()
    messages = make_messages(n)
    batches = [messages[i:i + BATCH] for i in range(0, n, BATCH)]
    return _median_rate(n, lambda: [framing.encode(b) for b in batches])


def measure_ceilings(n: int = N_MESSAGES) -> dict[str, float]:
    messages = [dict(m) for m in make_messages(n)]
    encoder, decoder = msgspec.json.Encoder(), msgspec.json.Decoder(dict)
    data = encoder.encode_lines(messages)
    batches = [messages[i:i + BATCH] for i in range(0, n, BATCH)]
    return {
        "msgspec_decode_lines_msgs_per_s": _median_rate(n, lambda: decoder.decode_lines(data)),
        "msgspec_encode_lines_msgs_per_s": _median_rate(
            n, lambda: [encoder.encode_lines(b) for b in batches]),
    }


def main() -> None:
    result = {
        "ndjson_decode_msgs_per_s": round(measure_ndjson_decode()),
        "ndjson_decode_one_buffer_msgs_per_s": round(measure_ndjson_decode_one_buffer()),
        "ndjson_encode_msgs_per_s": round(measure_ndjson_encode()),
        **{k: round(v) for k, v in measure_ceilings().items()},
        "message_bytes": len(NdjsonFraming().encode(make_messages(1))),
        "messages": N_MESSAGES,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
