"""A real Prometheus server (Debian's prometheus package) scrapes a running railshard job:
three ranks of examples/train.py under railshard-launch, each serving its metrics over HTTP
(RAILSHARD_METRICS_PORT), and the server's own HTTP API is asked for railshard's series --
collectives, bytes per rail, the dispatcher's shares and throughputs, the ranks' load
signals -- from every rank."""

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from conftest import REPO, UNDER_TEST_IS_RAILSHARD, launch_env, tool

LAUNCH = tool("railshard-launch")
PROMETHEUS = shutil.which("prometheus")

pytestmark = [
    pytest.mark.skipif(not UNDER_TEST_IS_RAILSHARD, reason="railshard's own metrics"),
    pytest.mark.skipif(not LAUNCH.exists(), reason=f"{LAUNCH} not built"),
    pytest.mark.skipif(PROMETHEUS is None,
                       reason="no prometheus server (apt-get install prometheus)"),
]


def _free_ports(count):
    """`count` consecutive free TCP ports on loopback."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count > 65000:
            continue
        try:
            held = []
            for port in range(base, base + count):
                sock = socket.socket()
                sock.bind(("127.0.0.1", port))
                held.append(sock)
            for sock in held:
                sock.close()
            return base
        except OSError:
            for sock in held:
                sock.close()
    raise RuntimeError("no free ports")


def _query(api, expr):
    url = f"http://127.0.0.1:{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.loads(answer.read())["data"]["result"]


def test_a_prometheus_server_scrapes_every_rank(tmp_path):
    ranks = 3
    metrics_port = _free_ports(ranks)
    api_port = _free_ports(1)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: railshard\n    static_configs:\n      - targets: ["
        + ", ".join(f"'127.0.0.1:{metrics_port + r}'" for r in range(ranks)) + "]\n")
    # Over the transport, so that bytes per rail have something to count.
    env = launch_env({"RAILSHARD_METRICS_PORT": metrics_port, "RAILSHARD_ALGO": "ring"})
    job = subprocess.Popen(
        [str(LAUNCH), "-n", str(ranks), sys.executable, str(REPO / "examples" / "train.py"),
         "--steps", "2000", "--sample-ms", "0.2", "--quiet"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    server = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{api_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wanted = ["railshard_collectives_total", "railshard_collective_bytes_total",
              "railshard_rail_bytes_total", "railshard_dispatch_shard_size",
              "railshard_dispatch_samples_per_second", "railshard_load_memory_bytes",
              "railshard_load_memory_limit_bytes", "railshard_load_cpu_quota_cores"]
    found = {}
    # Every series the shipped Grafana dashboard plots, but errors (none in a healthy job).
    dashboard = json.loads((REPO / "docs" / "grafana-railshard.json").read_text())
    plotted = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"railshard_[a-z_]+", target["expr"])}
    plotted.discard("railshard_errors_total")
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(found) < len(wanted):
            assert job.poll() is None, job.communicate()[0]
            time.sleep(1)
            for name in wanted:
                if name in found:
                    continue
                try:
                    result = _query(api_port, name)
                except OSError:
                    break  # the server is still starting
                rank_labels = {r["metric"].get("rank") for r in result}
                if len(rank_labels) == ranks:
                    found[name] = result
        # The targets are up, one per rank.
        up = _query(api_port, 'up{job="railshard"}')
        unplotted = {name for name in plotted if not _query(api_port, name)}
    finally:
        server.terminate()
        job.send_signal(signal.SIGTERM)
        try:
            out = job.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            job.kill()
            out = job.communicate()[0]
        server.wait(timeout=30)
    assert set(found) == set(wanted), f"missing {set(wanted) - set(found)}\n{out[-3000:]}"
    assert len(up) == ranks and all(r["value"][1] == "1" for r in up), up
    assert not unplotted, f"the dashboard plots series nobody exports: {unplotted}"
    # The values are the ranks' own: collectives counted up, shares of the global batch.
    collectives = sum(float(r["value"][1]) for r in found["railshard_collectives_total"])
    assert collectives > 0
    shares = [r for r in found["railshard_dispatch_shard_size"] if r["metric"]["rank"] == "0"]
    assert sum(float(r["value"][1]) for r in shares) == 512, shares
    assert all(float(r["value"][1]) > 1e6 for r in found["railshard_load_memory_bytes"])
