"""typhoon-controller's settings and the Ryu config it generates; the deploy/ samples."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

from controller.daemon import ControllerConfigError, build_parser, load_settings, main
from typhoon.cluster_file import load_cluster_file

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def settings(tmp_path: Path, text: str | None, *argv: str):
    path = None
    if text is not None:
        path = tmp_path / "controller.conf"
        path.write_text(text)
    return load_settings(path, build_parser().parse_args(list(argv)))


def test_sample_config_generates_what_ryu_reads(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    s = load_settings(
        DEPLOY / "controller.conf", build_parser().parse_args(["--api-token-file", str(token)])
    )
    assert s.apps == ["fault_detector", "live_debugger", "load_balancer"]
    ryu = configparser.ConfigParser(interpolation=None)
    ryu.read_string(s.ryu_config())
    assert ryu["DEFAULT"]["ofp_tcp_listen_port"] == "6653"
    assert ryu["DEFAULT"]["wsapi_host"] == "127.0.0.1"
    assert ryu["typhoon"]["coordinator"] == "zk://10.0.0.1:2181/typhoon"
    assert ryu["typhoon"]["api_token"] == "s3cret"
    assert not ryu.has_section("controller")  # ours, not Ryu's
    argv = s.ryu_argv(tmp_path / "ryu.conf")
    assert argv == ["--config-file", str(tmp_path / "ryu.conf"), "controller.core",
                    "apps.fault_detector", "apps.live_debugger", "apps.load_balancer"]  # fmt: skip


def test_command_line_overrides_the_file(tmp_path):
    text = "[controller]\napps = all\n[typhoon]\ncoordinator = /tmp/a.db\n"
    argv = ["--coordinator", "zk://z:2181/t", "--ofp-port", "6633", "--app", "autoscaler"]
    s = settings(tmp_path, text, *argv)
    assert s.apps == ["autoscaler"]
    assert s.ofp_port == 6633
    assert s.sections["typhoon"]["coordinator"] == "zk://z:2181/t"


def test_tls_switches_to_the_ssl_port(tmp_path):
    files = []
    for name in ("key", "cert", "ca"):
        f = tmp_path / name
        f.write_text("x")
        files.append(f)
    text = (f"[controller]\nctl_privkey = {files[0]}\nctl_cert = {files[1]}\n"
            f"ca_certs = {files[2]}\n")  # fmt: skip
    s = settings(tmp_path, text, "--coordinator", "zk://z/t")
    ryu = configparser.ConfigParser(interpolation=None)
    ryu.read_string(s.ryu_config())
    assert ryu["DEFAULT"]["ofp_ssl_listen_port"] == "6653"
    assert "ofp_tcp_listen_port" not in ryu["DEFAULT"]
    assert ryu["DEFAULT"]["ctl_cert"] == str(files[1])


@pytest.mark.parametrize(
    "text, argv, message",
    [
        ("[controller]\napps = fault_detektor\n", (),
         "unknown app 'fault_detektor' (apps: fault_detector, live_debugger"),
        ("[controller]\nofp_prot = 1\n", (), "[controller] ofp_prot: unknown key"),
        ("[controller]\nctl_cert = /x\n", (), "OpenFlow TLS needs all of"),
        ("[controller]\nofp_port = http\n", (), "ofp_port must be a port number, not 'http'"),
        ("[controller]\napi_token_file = /nonexistent/token\n", (), "api_token_file /nonexistent"),
        (None, (), None),  # no coordinator anywhere: raised by ryu_config
    ],
)  # fmt: skip
def test_bad_settings_are_one_sentence(tmp_path, text, argv, message):
    with pytest.raises(ControllerConfigError) as e:
        settings(tmp_path, text, *argv).ryu_config()
    assert (message or "no coordinator: set [typhoon] coordinator or --coordinator") in str(e.value)


def test_sample_cluster_file_is_valid():
    cf = load_cluster_file(DEPLOY / "cluster.yaml")
    assert cf.cluster().mtu == 1450
    assert list(cf.hosts) == ["h1", "h2"]


def test_print_config_redacts_the_token_and_writes_nothing(tmp_path, monkeypatch, capsys):
    from controller import daemon

    token = tmp_path / "token"
    token.write_text("s3cret-t0ken\n")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(daemon.tempfile, "tempdir", str(scratch))
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    argv = ["--config", str(DEPLOY / "controller.conf"), "--api-token-file", str(token)]
    assert daemon.main([*argv, "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "s3cret-t0ken" not in out
    assert f"api_token = {daemon.REDACTED}" in out
    assert "--config-file <a temporary directory>/ryu.conf controller.core" in out
    assert list(scratch.iterdir()) == []  # no ryu.conf holding the token left behind


def test_the_read_token_file_reaches_ryu_conf(tmp_path, capsys):
    read = tmp_path / "read-token"
    read.write_text("r3ad\n")
    conf = tmp_path / "c.conf"
    conf.write_text(f"[controller]\nread_token_file = {read}\n[typhoon]\ncoordinator = x.db\n")
    assert main(["--config", str(conf), "--runtime-dir", str(tmp_path), "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "r3ad" not in out and "read_token = " in out  # shown redacted, never written
    settings = load_settings(conf, build_parser().parse_args(["--config", str(conf)]))
    assert "read_token = r3ad" in settings.ryu_config()
    read.write_text("")
    assert main(["--config", str(conf), "--runtime-dir", str(tmp_path)]) == 2
