"""Take a screenshot of the web dashboard during a run like `make demo`
(`make dashboard-screenshot`; needs root, as the demo).

Starts `typhoon run topologies/wordcount.yaml --transport sdn --hosts 3` with the
four control-plane apps and a workdir, reads the controller's URL and token from
the run's `client.ini`, attaches the live debugger to one split worker (so that
panel has tuples to show), lets the charts fill for `--settle` seconds, and saves
the whole page, as headless Chromium draws it, to `--out` (default
`docs/dashboard.png`).  The source has more sentences than `make demo`'s (which
end within seconds here) and is drained once the picture is taken; the run then
ends as any run does, its report in `WORKDIR/demo-report.json`.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mininet_env.browser import headless_chromium
from typhoon.client import ApiCallError, Client, resolve

ROOT = Path(__file__).resolve().parents[1]
APPS = ["apps/fault_detector.py", "apps/live_debugger.py", "apps/load_balancer.py",
        "apps/autoscaler.py"]  # fmt: skip
NAME = "wordcount"


def log(text: str) -> None:
    print(f"[dashboard-screenshot] {text}", file=sys.stderr, flush=True)


def wait(predicate, timeout: float, what: str, run: subprocess.Popen) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run.poll() is not None:
            raise SystemExit(f"the run ended (exit code {run.returncode}) before {what}")
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")


def active(client: Client) -> bool:
    try:
        return bool(client.call("GET", f"/apps/{NAME}").get("state", {}).get("active"))
    except ApiCallError:
        return False  # not submitted yet


def page_moving(driver) -> bool:
    nodes = driver.find_elements("css selector", "#graph g.node")
    return bool(nodes) and all(float(n.get_attribute("data-rate") or 0) > 0 for n in nodes)


def page_live(driver) -> bool:
    """The page's last poll succeeded and shows an application."""
    status = driver.find_element("id", "status").text
    return status.startswith("updated") and bool(driver.find_elements("css selector", "g.node"))


def debug_tuples(driver) -> bool:
    boxes = driver.find_elements("css selector", "#debug .tuples")
    return any(e.text.startswith("#") for e in boxes)  # "#N sender -> receiver ..."


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    p.add_argument("--workdir", type=Path, help="keep the run's logs here (default: a temp dir)")
    p.add_argument("--count", type=int, default=5_000_000, help="sentences (drained after)")
    p.add_argument("--settle", type=float, default=20.0, help="seconds of charts before the shot")
    p.add_argument("--width", type=int, default=1400)
    args = p.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="typhoon-dash-"))
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "typhoon_cli",
        "run",
        "topologies/wordcount.yaml",
        "--transport",
        "sdn",
        "--hosts",
        "3",
        "--arg",
        f"source.count={args.count}",
        "--workdir",
        str(workdir),
        "--report",
        str(workdir / "demo-report.json"),
        "-q",
    ]
    for app in APPS:
        cmd += ["--app", app]  # fmt: skip
    log(f"run: {' '.join(cmd[1:])}")
    run = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL)
    try:
        ini = workdir / "client.ini"
        wait(ini.is_file, 120, "the cluster to start (client.ini)", run)
        endpoint = resolve(config=str(ini))
        client = Client(endpoint, retries=5)
        wait(lambda: active(client), 120, f"'{NAME}' to become active", run)
        attach = {"worker": "split[0]", "direction": "out", "sample": 5.0}
        session = client.call("POST", f"/apps/{NAME}/debug", attach)
        log(f"debug session {session['session']} on split[0]")
        url = endpoint.controller.removesuffix("/typhoon").rstrip("/")
        with headless_chromium(args.width, 1000) as driver:
            driver.get(f"{url}/dashboard")  # the page takes the token typed in, never a link's
            driver.find_element("id", "token").send_keys(endpoint.token)
            driver.find_element("css selector", "#token-form button").click()
            wait(lambda: page_moving(driver), 60, "a rate on every node of the page", run)
            wait(lambda: debug_tuples(driver), 60, "debugged tuples on the page", run)
            time.sleep(args.settle)
            for _ in range(3):  # the whole page: a viewport as tall as the document
                height = driver.execute_script("return document.documentElement.scrollHeight")
                # (a headless window does not grow past its screen; the viewport does)
                viewport = {"width": args.width, "height": int(height), "deviceScaleFactor": 1}
                driver.execute_cdp_cmd(
                    "Emulation.setDeviceMetricsOverride", {**viewport, "mobile": False}
                )
                time.sleep(1.5)  # one more poll at the new size
            wait(lambda: page_live(driver), 5, "the page to be up to date", run)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(args.out))
            if run.poll() is not None:
                raise SystemExit("the run ended while the picture was taken: try a larger --count")
        log(f"wrote {args.out}")
        try:
            client.call("DELETE", f"/apps/{NAME}/debug/{session['session']}")
        except ApiCallError as e:  # ended already (e.g. its worker was replaced)
            log(f"detach: {e.message}")
        # forced: DRAIN alone is refused (a step of the stable update); here it ends the run
        drain = {"type": "DRAIN", "body": {"version": 1}, "node": "source", "force": True}
        client.call("POST", f"/apps/{NAME}/control", drain)
        log("source drained: the run ends once every worker has finished")
        code = run.wait(timeout=600)
        log(f"run ended with exit code {code}; report {workdir / 'demo-report.json'}")
        return 0
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)  # the runner tears its cluster down on ^C
            run.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
