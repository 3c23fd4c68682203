"""When the certificates a process serves expire, as the metric
``gazette_tls_certificate_expiry_timestamp_seconds{file}`` (an alert fires 14 days ahead).

The files are read at each scrape (they rotate under a running process), and only the
validity of their first certificate (the leaf) is decoded: a few DER lengths, no
dependency beyond the standard library.
"""

from __future__ import annotations

import base64
import calendar
import re
import threading
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.S)
_SEQUENCE, _UTC_TIME, _GENERALIZED_TIME, _VERSION = 0x30, 0x17, 0x18, 0xA0


def _element(der: bytes, at: int) -> tuple[int, int, int]:
    """The DER element at `at`: (tag, start of its content, end of its content)."""
    tag, length = der[at], der[at + 1]
    at += 2
    if length & 0x80:
        n = length & 0x7F
        length = int.from_bytes(der[at:at + n], "big")
        at += n
    if at + length > len(der):
        raise ValueError("a DER length runs past the certificate")
    return tag, at, at + length


def _time(tag: int, text: str) -> int:
    if tag == _UTC_TIME:  # YYMMDDHHMMSSZ: years 1950-2049 (RFC 5280)
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"
    elif tag != _GENERALIZED_TIME:
        raise ValueError(f"a certificate's validity holds tag {tag:#x}, not a time")
    y, mo, d, h, mi, s = (int(text[i:j]) for i, j in
                          ((0, 4), (4, 6), (6, 8), (8, 10), (10, 12), (12, 14)))
    return calendar.timegm((y, mo, d, h, mi, s))


def not_after(der: bytes) -> int:
    """Unix seconds at which the DER certificate `der` stops being valid."""
    _, cert, _ = _element(der, 0)  # Certificate ::= SEQUENCE { tbsCertificate, ... }
    tag, at, _ = _element(der, cert)
    if tag != _SEQUENCE:
        raise ValueError("not an X.509 certificate")
    if der[at] == _VERSION:  # [0] version, when not v1
        at = _element(der, at)[2]
    for _skip in range(3):  # serialNumber, signature, issuer
        at = _element(der, at)[2]
    tag, validity, _ = _element(der, at)
    if tag != _SEQUENCE:
        raise ValueError("a certificate without its validity")
    before = _element(der, validity)
    tag, start, end = _element(der, before[2])
    return _time(tag, der[start:end].decode("ascii"))


def pem_not_after(pem: bytes) -> int:
    """When the first certificate of a PEM file expires."""
    found = _PEM.search(pem)
    if found is None:
        raise ValueError("no PEM certificate")
    return not_after(base64.b64decode(b"".join(found.group(1).split())))


class _Expiries(Collector):
    """The expiry of every certificate file this process serves (read at each scrape;
    a file that cannot be read or decoded is left out, and TLS itself says why)."""

    def __init__(self) -> None:
        self._files: set[str] = set()
        self._lock = threading.Lock()

    def add(self, path: str) -> None:
        with self._lock:
            self._files.add(path)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "gazette_tls_certificate_expiry_timestamp_seconds",
            "Unix time at which the certificate a process serves (the first of its file) "
            "expires", labels=["file"])
        with self._lock:
            files = sorted(self._files)
        for path in files:
            try:
                family.add_metric([path], pem_not_after(Path(path).read_bytes()))
            except (OSError, ValueError, IndexError):
                continue
        yield family


EXPIRIES = _Expiries()
REGISTRY.register(EXPIRIES)


def watch_expiry(cert_file: str) -> None:
    """Report when `cert_file`'s certificate expires, from now on."""
    if cert_file:
        EXPIRIES.add(cert_file)
