"""A cluster over TLS: scheduler, nannies, workers and ROSE's own traffic (placement reports, weight
sync's worker-to-worker rpc) on `tls://`, with certificates this test makes (a CA and one cert signed by
it, used by every role, as a small deployment would)."""
import datetime
import ipaddress

import pytest

import rose
from rose.config import ClusterConfig
from tests.integration.helpers import FP32, small_pipeline

pytestmark = pytest.mark.integration


def _write_ca_and_cert(d) -> tuple[str, str, str]:
    """(ca.pem, cert.pem, key.pem): a self-signed CA and a cert for 127.0.0.1 it signed."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def build(subject, issuer, public_key, signing_key, ca: bool):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
             .serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                critical=False)
        return b.sign(signing_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rose-test-ca")])
    ca = build(ca_name, ca_name, ca_key.public_key(), ca_key, ca=True)
    cert = build(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rose-test")]), ca_name, key.public_key(),
                 ca_key, ca=False)
    paths = (d / "ca.pem", d / "cert.pem", d / "key.pem")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return tuple(map(str, paths))


def test_one_step_over_tls_and_plain_tcp_is_refused(tmp_path):
    from distributed import Client, Security

    from rose.runtime.cluster import LocalRoseCluster

    ca, cert, key = _write_ca_and_cert(tmp_path)
    security = Security(tls_ca_file=ca, require_encryption=True,
                        tls_client_cert=cert, tls_client_key=key, tls_scheduler_cert=cert, tls_scheduler_key=key,
                        tls_worker_cert=cert, tls_worker_key=key)
    with LocalRoseCluster(ClusterConfig(num_dedicated=1), FP32, security=security) as cluster:
        addr = cluster.scheduler_address
        assert addr.startswith("tls://")
        # Without TLS the scheduler does not talk: a plain-TCP client at the same host:port fails to connect.
        with pytest.raises((OSError, TimeoutError)):
            Client(addr.replace("tls://", "tcp://", 1), timeout="10s").close()
        with Client(cluster) as client:  # the cluster's Security, so TLS
            workers = client.scheduler_info(n_workers=-1)["workers"]
            assert workers and all(a.startswith("tls://") for a in workers)
            report = rose.run(small_pipeline("guess", groups=2, group_size=2, steps=1), cluster=client,
                              progress=False)
            state = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["rose"].state())
    t = report.trajectories
    assert t.num_rows == 4 and report.summary["failed"] == 0
    assert report.lost == 0 and report.duplicated == 0
    assert all(w.startswith("tls://") for w in t["worker"].to_pylist())
    # the placement plugin placed both groups, and the step's sync reached the engine over TLS
    assert state["errors"] == 0
    assert sum(w["dispatched"] for w in state["workers"].values()) == 2
    assert (report.metrics["sync_bytes"] > 0).all()
    assert [w["weight_version"] for w in state["workers"].values() if w["role"] == "dedicated"] == [1]
