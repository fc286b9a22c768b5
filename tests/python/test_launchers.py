"""The same unmodified script under every launcher users start ranks with: railshard-launch,
mpirun, torchrun (python -m torch.distributed.run). Real launchers, real processes; each rank
all-reduces its rank + 1 and checks the sum, so a wrong world (bad RANK/WORLD_SIZE mapping)
fails, not only a missing one."""

import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

from conftest import child_env, tool

SCRIPT = textwrap.dedent("""
    import torch, torch.distributed as dist, railshard
    railshard.init_process_group()
    n = dist.get_world_size()
    t = torch.full((1000,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    assert t.eq(n * (n + 1) / 2).all(), t[:4]
    print(f"rank {dist.get_rank()} of {n} ok", flush=True)
    dist.destroy_process_group()
""")

LAUNCH = tool("railshard-launch")


def _run(cmd, tmp_path, extra_env=None, text=SCRIPT, timeout=180):
    script = tmp_path / "allreduce_script.py"
    script.write_text(text)
    env = child_env()
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(name, None)
    env.update(extra_env or {})
    proc = subprocess.run(cmd + [str(script)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    return proc


def _check(proc, n):
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for rank in range(n):
        assert f"rank {rank} of {n} ok" in out, out


@pytest.mark.skipif(not LAUNCH.exists(), reason=f"{LAUNCH} not built")
def test_railshard_launch(tmp_path):
    _check(_run([str(LAUNCH), "-n", "3", sys.executable], tmp_path), 3)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun (apt-get install openmpi-bin)")
def test_mpirun(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _check(_run(_mpirun(3), tmp_path, {"MASTER_PORT": str(port)}), 3)


# The README's snippet as written: torch's own init_process_group, no railshard helper. mpirun
# sets no RANK/WORLD_SIZE; `import railshard` fills them in from OpenMPI's variables.
PLAIN_SCRIPT = SCRIPT.replace("railshard.init_process_group()",
                              'dist.init_process_group("railshard")')


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun (apt-get install openmpi-bin)")
def test_mpirun_with_torchs_own_init_process_group(tmp_path):
    assert PLAIN_SCRIPT != SCRIPT
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _check(_run(_mpirun(2), tmp_path, {"MASTER_PORT": str(port)}, text=PLAIN_SCRIPT), 2)


def _mpirun(n):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(n),
           "-x", "MASTER_PORT"]
    if "PYTHONPATH" in child_env():  # a build tree's module; an installed one needs nothing
        cmd += ["-x", "PYTHONPATH"]
    return cmd + [sys.executable]


TORCH_MAJOR = int(__import__("torch").__version__.split(".")[0])


def test_torchrun(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    if TORCH_MAJOR < 2:
        # torch 1.13's default --redirects 0 trips over Python 3.11's enum change in
        # torch.distributed.elastic ("'NoneType' object has no attribute 'get'"); 1 works.
        cmd += ["--redirects", "1", "--tee", "1"]
    _check(_run(cmd, tmp_path), 2)


RESTART_SCRIPT = textwrap.dedent("""
    import os, signal, torch, torch.distributed as dist, railshard
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    railshard.init_process_group()
    n = dist.get_world_size()
    t = torch.full((1000,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    assert t.eq(n * (n + 1) / 2).all(), t[:4]
    if attempt == 0 and dist.get_rank() == 0:
        os.kill(os.getpid(), signal.SIGKILL)  # rank 0, which hosts nothing under torchrun
    dist.barrier()
    print(f"attempt {attempt}: rank {dist.get_rank()} of {n} ok", flush=True)
    dist.destroy_process_group()
""")


def test_torchrun_restarts_the_group_when_rank_zero_is_killed(tmp_path):
    # torchrun's agent hosts the store, so rank 0 is no single point of failure: with
    # --max-restarts 1 every worker is started again and the group forms anew. torch >= 2.5
    # shares that store with the workers and the restarted ones would read the first
    # attempt's keys (pytorch/pytorch#135712): TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "3", "--max_restarts", "1"]
    if TORCH_MAJOR < 2:
        cmd += ["--redirects", "1", "--tee", "1"]
    proc = _run(cmd, tmp_path, {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                                "RAILSHARD_TIMEOUT": "30"}, text=RESTART_SCRIPT, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for rank in range(3):
        assert f"attempt 1: rank {rank} of 3 ok" in out, out
    assert "attempt 0: rank" not in out, out  # rank 0 died before anyone passed the barrier
