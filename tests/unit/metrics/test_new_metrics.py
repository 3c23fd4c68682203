"""The metrics dashboards and alerts lean on that are computed, not merely counted: a
shard's lag in time, certificate expiry, and a shard's status as series."""

from __future__ import annotations

import calendar
import datetime as dt
from pathlib import Path

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client import REGISTRY

from gazette.auth.expiry import not_after, pem_not_after, watch_expiry
from gazette.consumer import lag as lag_mod
from gazette.consumer.lag import ShardLag, _Journal
from gazette.consumer.shard import export_status
from gazette.protocol import ReplicaState, ReplicaStatus


def _cert(not_valid_after: dt.datetime) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "broker")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(12345678901234567890)
            .not_valid_before(dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
            .not_valid_after(not_valid_after)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


@pytest.mark.parametrize("when", [
    dt.datetime(2027, 3, 4, 5, 6, 7, tzinfo=dt.UTC),   # UTCTime (before 2050)
    dt.datetime(2051, 12, 31, 23, 59, 59, tzinfo=dt.UTC),  # GeneralizedTime
])
def test_certificate_expiry_is_read_from_the_pem(when: dt.datetime) -> None:
    pem = _cert(when)
    assert pem_not_after(pem) == calendar.timegm(when.utctimetuple())
    der = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
    assert not_after(der) == calendar.timegm(when.utctimetuple())


def test_certificate_expiry_is_exported_for_served_files(tmp_path: Path) -> None:
    ca = trustme.CA()
    served = tmp_path / "tls.crt"
    ca.issue_cert("localhost").cert_chain_pems[0].write_to_path(str(served))
    bad = tmp_path / "garbage.crt"
    bad.write_text("not a certificate")
    watch_expiry(str(served))
    watch_expiry(str(bad))
    assert REGISTRY.get_sample_value("gazette_tls_certificate_expiry_timestamp_seconds",
                                     {"file": str(served)}) == pem_not_after(
        served.read_bytes())
    # a file that does not decode is left out (TLS itself says why), not a scrape error
    assert REGISTRY.get_sample_value("gazette_tls_certificate_expiry_timestamp_seconds",
                                     {"file": str(bad)}) is None


def test_lag_in_time_is_the_age_of_the_oldest_uncommitted_note() -> None:
    j = _Journal(committed=100)
    j.saw(100, now=10.0)  # nothing past the committed offset
    assert j.seconds(now=11.0) == 0.0
    j.saw(200, now=20.0)
    j.saw(250, now=20.2)  # within the resolution: the 20.0 note stands for it
    j.saw(300, now=21.0)
    assert j.seconds(now=25.0) == 5.0
    j.commit(200)  # bytes up to 200 were seen at 20.0; what is left was seen by 21.0
    assert j.seconds(now=25.0) == 4.0
    j.commit(300)
    assert j.seconds(now=25.0) == 0.0


def test_lag_notes_stay_bounded() -> None:
    j = _Journal(committed=0)
    for i in range(1, 3 * lag_mod.MAX_NOTES):
        j.saw(i, now=float(i))
    assert len(j.heads) <= lag_mod.MAX_NOTES
    assert j.seconds(now=1e6) == 1e6 - j.times[0]


def test_shard_lag_exports_bytes_and_seconds_and_goes_when_closed() -> None:
    lag = ShardLag("unit/lag-shard")
    lag.committed({"unit/j": 10})
    lag.saw_head("unit/j", 50)
    lag.committed({"unit/j": 20})
    labels = {"shard": "unit/lag-shard", "journal": "unit/j"}
    assert REGISTRY.get_sample_value("gazette_consumer_lag_bytes", labels) == 30
    seconds = REGISTRY.get_sample_value("gazette_consumer_lag_seconds", labels)
    assert seconds is not None and seconds >= 0
    lag.close()
    assert REGISTRY.get_sample_value("gazette_consumer_lag_bytes", labels) is None
    assert REGISTRY.get_sample_value("gazette_consumer_lag_seconds", labels) is None


def test_shard_status_is_one_series_per_state() -> None:
    shard = "unit/status-shard"
    export_status(shard, ReplicaStatus(ReplicaState.RECOVERING, played=30, to_play=100))
    values = {s.name: REGISTRY.get_sample_value("gazette_consumer_shard_status",
                                                {"shard": shard, "status": s.name})
              for s in ReplicaState}
    assert values == {"PENDING": 0, "RECOVERING": 1, "STANDBY": 0, "PRIMARY": 0,
                      "FAILED": 0}
    assert REGISTRY.get_sample_value("gazette_consumer_recovery_behind_bytes",
                                     {"shard": shard}) == 70
    export_status(shard, ReplicaStatus(ReplicaState.FAILED, "boom"))
    assert REGISTRY.get_sample_value("gazette_consumer_shard_status",
                                     {"shard": shard, "status": "FAILED"}) == 1
    assert REGISTRY.get_sample_value("gazette_consumer_recovery_behind_bytes",
                                     {"shard": shard}) == 0
    export_status(shard, None)
    assert REGISTRY.get_sample_value("gazette_consumer_shard_status",
                                     {"shard": shard, "status": "FAILED"}) is None
