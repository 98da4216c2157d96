"""ZooKeeper credentials from the coordinator URL: the file, its mode, its one line.

The refusals by a real ZooKeeper are in test_coordinator_zookeeper.py; the
contract runs with ACLs on in test_coordinator_contract.py.
"""

from __future__ import annotations

import pytest

from typhoon.coordinator import CoordinatorError, parse_zk_url, zk_url
from typhoon.coordinator.zk_auth import read_credentials


def test_the_url_names_the_file_not_the_secret(tmp_path) -> None:
    parsed = zk_url("zk://h1:2181,h2:2181/ty?auth_file=/etc/typhoon/zk-auth")
    assert (parsed.hosts, parsed.prefix, parsed.auth_file) == (
        "h1:2181,h2:2181", "/ty", "/etc/typhoon/zk-auth"
    )  # fmt: skip
    assert parse_zk_url("zk://h1:2181?auth_file=/x") == ("h1:2181", "/typhoon")
    assert zk_url("zk://h1/ty").auth_file is None and zk_url("zk://h1/ty").credentials() is None
    with pytest.raises(CoordinatorError, match="unknown parameter 'password'"):
        zk_url("zk://h1/ty?password=x")
    with pytest.raises(CoordinatorError, match="auth_file needs one value"):
        zk_url("zk://h1/ty?auth_file=")


def test_the_credentials_file_is_private_and_one_line(tmp_path) -> None:
    f = tmp_path / "zk-auth"
    f.write_text("typhoon:s3cret\n")
    f.chmod(0o600)
    assert read_credentials(str(f)) == "typhoon:s3cret"
    assert zk_url(f"zk://h1/ty?auth_file={f}").credentials() == "typhoon:s3cret"
    f.chmod(0o640)
    with pytest.raises(CoordinatorError, match=r"readable by others \(mode 0640\); chmod 0600"):
        read_credentials(str(f))
    f.chmod(0o600)
    for bad in ("no-colon\n", ":nouser\n", "user:\n", "a:b\nc:d\n"):
        f.write_text(bad)
        with pytest.raises(CoordinatorError, match="must hold one line 'user:password'"):
            read_credentials(str(f))
    f.write_text("\n")
    with pytest.raises(CoordinatorError, match="is empty"):
        read_credentials(str(f))
    with pytest.raises(CoordinatorError, match="No such file"):
        read_credentials(str(tmp_path / "missing"))
    link = tmp_path / "link"
    link.symlink_to(f)
    with pytest.raises(CoordinatorError):
        read_credentials(str(link))


def test_a_cluster_file_takes_the_url_with_its_credentials_file() -> None:
    import yaml

    from typhoon.cluster_file import parse_cluster_text

    url = "zk://10.0.0.1:2181/typhoon?auth_file=/etc/typhoon/zk-auth"
    doc = {
        "controller": "tcp:10.0.0.1:6653",
        "coordinator": url,
        "fabric": {"type": "vxlan", "mtu": 1500, "key": 42},
        "hosts": {"h1": {"address": "10.0.0.1", "bridge": "br-ty", "dpid": 1}},
    }
    assert parse_cluster_text(yaml.safe_dump(doc), "c.yaml").coordinator == url
