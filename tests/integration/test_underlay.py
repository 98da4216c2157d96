"""``machines.Underlay.close`` leaves no network device behind, also when a machine's
namespace outlives ``ip netns del``.

After a power cut (tests/integration/test_machines.py) a machine's processes die
after the link that carried their connections: their TCP connections become
orphans that retransmit a FIN which cannot leave, and hold the namespace for
minutes after its name was deleted; a veth pair left to the namespace stays
with it, its outer end in the root namespace.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from harness import wait
from machines import Underlay, links_named

# test_machines.py checks the same after its power cut, in the suite's time
pytestmark = [pytest.mark.integration, pytest.mark.long]

CONNECT = (
    "import socket, sys, time\n"
    "c = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n"
    "c.sendall(b'x'); print('sent', flush=True); time.sleep(120)\n"
)


def test_close_removes_the_veth_of_a_namespace_an_orphaned_connection_holds(tmp_path):
    net = Underlay(tmp_path, 1)
    try:
        net.start(phy=False)
        (m,) = net.machines
        m.run("ip", "addr", "add", f"{m.address}/24", "dev", m.nic)
        with socket.create_server((net.gateway, 0)) as listener:
            listener.settimeout(20)
            port = listener.getsockname()[1]
            argv = m.argv(sys.executable, "-c", CONNECT, net.gateway, str(port))
            client = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
            conn, _ = listener.accept()
            with conn:
                assert client.stdout is not None and client.stdout.readline() == "sent\n"
                m.run("ip", "link", "set", m.nic, "down")  # as when its switch died
                client.kill()
                client.wait()
                wait(
                    lambda: "FIN-WAIT-1" in m.run("ss", "-tan"),
                    10,
                    "the killed client's connection to be an orphan",
                )
    finally:
        net.close()
    left = links_named(net.prefix)
    for name in left:  # not this test's leak, whatever the outcome
        subprocess.run(["ip", "link", "del", name], capture_output=True)
    assert left == []
