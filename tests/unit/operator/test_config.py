"""The operator's configuration from its environment: etcd's client TLS as the chart
sets it under ``etcd.tls`` (the operator once ignored it and could not reach an etcd
that requires client certificates)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from gazette.errors import ValidationError
from gazette_operator.operator import Config


def test_etcd_client_tls_comes_from_the_environment(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, key, ca_file = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt"
    issued = ca.issue_cert("operator")
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    config = Config({"ETCD_ADDRESS": "https://etcd:2379", "ETCD_CERT_FILE": str(cert),
                     "ETCD_KEY_FILE": str(key), "ETCD_CA_FILE": str(ca_file)})
    assert config.etcd_tls is not None
    assert (config.etcd_tls.cert_file, config.etcd_tls.key_file,
            config.etcd_tls.ca_file) == (str(cert), str(key), str(ca_file))
    assert Config({"ETCD_ADDRESS": "http://etcd:2379"}).etcd_tls is None


@pytest.mark.parametrize(("env", "field"), [
    ({"ETCD_CERT_FILE": "/nonexistent/tls.crt", "ETCD_KEY_FILE": "/nonexistent/tls.key"},
     "ETCD_CERT_FILE"),
    ({"ETCD_CERT_FILE": "/nonexistent/tls.crt"}, "ETCD_KEY_FILE"),
    ({"ETCD_CA_FILE": "/nonexistent/ca.crt"}, "ETCD_CA_FILE"),
])
def test_bad_etcd_tls_names_its_variable(env: dict[str, str], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        Config(env)
    assert err.value.field == field, err.value
