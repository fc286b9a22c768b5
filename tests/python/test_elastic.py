"""Elastic PyTorch training (railshard.ElasticGroup + ElasticDataParallel) under the real
launcher: examples/train.py --elastic with a rank SIGKILLed, with and without
railshard-launch restarting it. Judged against an independent reference: the same model
trained in this process, one full batch per step over the very samples the job says each
step covered (plain torch, no railshard), must end with the job's parameters; every rank's
replica must agree (the joiner's too); the ledger the ranks built from the sample ids they
processed must say every sample once per epoch."""

import os
import re
import subprocess
import sys

import pytest

from conftest import BUILD_PYTHON, INSTALLED, REPO, UNDER_TEST_IS_RAILSHARD, launch_env, tool

LAUNCH = tool("railshard-launch")
TRAIN = REPO / "examples" / "train.py"

pytestmark = [
    pytest.mark.skipif(not UNDER_TEST_IS_RAILSHARD, reason="railshard's own elastic group"),
    pytest.mark.skipif(not LAUNCH.exists(), reason=f"{LAUNCH} not built"),
]

SMALL = ["--batch", "128", "--samples", "2048", "--hidden", "32", "--quiet"]


def _train(launch_args, train_args, save, timeout=240):
    cmd = [str(LAUNCH)] + launch_args + [sys.executable, str(TRAIN), "--elastic",
                                         "--save", str(save)] + SMALL + train_args
    proc = subprocess.run(cmd, env=launch_env(), capture_output=True, text=True, timeout=timeout)
    return proc, proc.stdout + proc.stderr


def _run_alone(script):
    """Runs `script` as a world of one (no launcher); its output, once it exited 0."""
    proc = subprocess.run([sys.executable, str(script)], env=launch_env(), capture_output=True,
                          text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return out


def _reference(saved):
    """The job's training in one process: per committed step, the mean loss over the step's
    samples (the epoch's permutation, seeded by the epoch: the sampler's default), one SGD
    step with momentum."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(TRAIN.parent))
    from train import SyntheticTask, make_model

    torch.set_num_threads(1)
    data = SyntheticTask(saved["samples"])
    model = make_model(saved["hidden"])
    optimizer = torch.optim.SGD(model.parameters(), lr=saved["lr"], momentum=0.9)
    orders = {}
    for epoch, first, count in saved["steps"]:
        if epoch not in orders:
            generator = torch.Generator()
            generator.manual_seed(epoch)
            orders[epoch] = torch.randperm(len(data), generator=generator)
        index = orders[epoch][first:first + count]
        optimizer.zero_grad()
        F.cross_entropy(model(data.x[index]), data.y[index]).backward()
        optimizer.step()
    return [p.detach() for p in model.parameters()]


def _check_result(out, save, steps, epochs, ranks):
    import torch

    for epoch in range(epochs):
        assert (f"# ledger: epoch {epoch}: 2048 samples, each processed exactly once "
                "(0 missing, 0 duplicated)") in out, out
    assert "NOT exactly once" not in out, out
    checksums = dict(re.findall(r"launch rank (\d+) parameter checksum (\S+)", out))
    assert sorted(int(r) for r in checksums) == ranks, out
    assert len(set(checksums.values())) == 1, f"replicas disagree: {checksums}\n{out}"
    saved = torch.load(save, weights_only=False)
    assert len(saved["steps"]) == steps, saved["steps"]
    # Each epoch's steps cover it once, in order (the plan's positions are contiguous).
    per_epoch = {}
    for epoch, first, count in saved["steps"]:
        assert first == per_epoch.get(epoch, 0), saved["steps"]
        per_epoch[epoch] = first + count
    assert all(v == 2048 for e, v in per_epoch.items() if e < epochs), per_epoch
    for got, want in zip(saved["params"], _reference(saved)):
        assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()


def test_a_rank_killed_after_its_backward_its_step_is_redone_by_the_survivors(tmp_path):
    save = tmp_path / "final.pt"
    proc, out = _train(["-n", "4", "--elastic"],
                       ["--steps", "20", "--sample-ms", "0.5", "--kill", "1:5:backward"], save)
    assert proc.returncode == 0, out
    assert "train.py: rank 1 kills itself in step 5, after its backward" in out, out
    assert re.search(r"launch rank\(s\) \[1\] lost in step 5; 3 survivors, steps 0\.\.4 stand",
                     out), out
    _check_result(out, save, steps=20, epochs=1, ranks=[0, 2, 3])


def test_the_launcher_restarts_a_killed_rank_it_joins_and_training_matches_one_process(tmp_path):
    save = tmp_path / "final.pt"
    # Steps slow enough (about 100 ms) for the restarted interpreter to import torch and join
    # while the survivors still train.
    proc, out = _train(["-n", "4", "--max-restarts", "1"],
                       ["--steps", "70", "--sample-ms", "3", "--kill", "2:6"], save)
    assert proc.returncode == 0, out
    assert "train.py: rank 2 kills itself after step 6" in out, out
    assert re.search(r"launch rank\(s\) \[2\] lost in step 7; 3 survivors, steps 0\.\.6 stand",
                     out), out
    joined = re.search(r"launch rank\(s\) \[4\] joined before step (\d+): 4 ranks", out)
    assert joined, out
    assert 7 < int(joined.group(1)) < 70, out
    assert re.search(r"first step after joining \(step \d+, 4 ranks\)", out), out
    _check_result(out, save, steps=70, epochs=4, ranks=[0, 1, 3, 4])


def test_a_job_started_on_two_ranks_grows_to_four_with_two_hand_started_joiners(tmp_path):
    # railshard-launch --min-ranks 1 on a fixed port with a known token; two more processes
    # started beside it "by hand" (as from another shell or host) with the job's store
    # address, token and RAILSHARD_JOIN=1. They connect when the store is up (retrying until
    # it is), ask to join, and the members admit them at the next step boundary.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    save = tmp_path / "final.pt"
    args = SMALL + ["--steps", "48", "--sample-ms", "4"]
    env = launch_env()
    env["RAILSHARD_TOKEN"] = "grow-from-the-start"
    members = subprocess.Popen(
        [str(LAUNCH), "-n", "2", "--min-ranks", "1", "--store-port", str(port), sys.executable,
         str(TRAIN), "--elastic", "--save", str(save)] + args,
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    joiner_env = dict(env, RAILSHARD_JOIN="1", RAILSHARD_STORE_EXTERNAL="1",
                      RAILSHARD_STORE_ADDR=f"127.0.0.1:{port}", RAILSHARD_RANK="0",
                      RAILSHARD_WORLD_SIZE="2")
    joiners = [subprocess.Popen([sys.executable, str(TRAIN), "--elastic"] + args,
                                env=joiner_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=240)[0] for p in [members] + joiners]
    finally:
        for p in [members] + joiners:
            p.kill()
    out = "\n".join(outs)
    assert [p.returncode for p in [members] + joiners] == [0, 0, 0], out
    # Both in one grow when they ask before the same step boundary, else one grow each (a
    # joiner admitted first is a member in the second): either way 2, 3 and nothing else.
    grows = re.findall(r"launch rank\(s\) \[([\d, ]+)\] joined before step (\d+): (\d) ranks",
                       out)
    assert grows and all(int(step) < 48 for _, step, _ in grows), out
    assert sorted(int(r) for ranks, _, _ in grows for r in ranks.split(",")) == [2, 3], out
    assert grows[-1][2] == "4", out
    assert re.search(r"train.py: done; 48 steps on 4 ranks, [12] membership change\(s\)", out)
    _check_result(out, save, steps=48, epochs=3, ranks=[0, 1, 2, 3])


def test_unsupported_arguments_are_errors_naming_them(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text(
        "import torch, railshard\n"
        "for kwargs in ({'dataset_size': -1}, {'dataset_size': 8}):\n"
        "    try:\n"
        "        railshard.ElasticGroup(**kwargs)\n"
        "    except ValueError as e:\n"
        "        print('ValueError:', e)\n"
        "group = railshard.ElasticGroup()\n"
        "print('size', group.size, 'rank', group.rank, 'joined', group.joined)\n"
        "try:\n"
        "    group.next_step()\n"
        "except railshard.InvalidArgument as e:\n"
        "    print('InvalidArgument:', e)\n"
        "for kwargs in ({'static_graph': True}, {'find_unused_parameters': False}):\n"
        "    try:\n"
        "        railshard.ElasticDataParallel(torch.nn.Linear(2, 2), group, **kwargs)\n"
        "    except ValueError as e:\n"
        "        print('ValueError:', e)\n"
        "group.close()\n"
        "try:\n"
        "    group.process_group.allreduce([torch.ones(1)]).wait()\n"
        "except railshard.InvalidArgument as e:\n"
        "    print('after close:', e)\n")
    out = _run_alone(script)
    assert "ValueError: ElasticGroup: dataset_size -1 < 0" in out, out
    assert "ValueError: ElasticGroup: global_batch_size 0 < 1" in out, out
    assert "size 1 rank 0 joined False" in out, out
    assert ("InvalidArgument: railshard InvalidArgument: ElasticGroup.next_step: the group has "
            "no dispatcher (pass dataset_size)") in out, out
    assert "ValueError: ElasticDataParallel: static_graph=True is not supported" in out, out
    assert "ValueError: ElasticDataParallel: find_unused_parameters=False is not supported" in out
    assert "after close: railshard ALLREDUCE: the process group was shut down" in out, out


def test_the_elastic_sampler_hands_out_one_step_at_a_time(tmp_path):
    # A world of one (no launcher): the epoch's indices come out once each through a
    # DataLoader, the group's epoch count carries into the next iteration, and what would let
    # the sampler plan ahead -- a step not reported, a DataLoader with workers -- is refused.
    script = tmp_path / "sampler.py"
    script.write_text(
        "import torch, railshard\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "data = TensorDataset(torch.arange(64))\n"
        "group = railshard.ElasticGroup(64, global_batch_size=16, micro_batch=4)\n"
        "sampler = railshard.ThroughputSampler(data, group=group, state={})\n"
        "print('type', type(sampler).__name__, 'len', len(sampler))\n"
        "for epoch in range(2):\n"
        "    seen = []\n"
        "    for (batch,) in DataLoader(data, batch_sampler=sampler):\n"
        "        assert batch.tolist() == sampler.indices, (batch, sampler.indices)\n"
        "        seen += batch.tolist()\n"
        "        sampler.report(0.01)\n"
        "    print('epoch', epoch, 'steps', len(seen) // 16, 'once', sorted(seen) == list(range(64)),"
        " 'completed', group.epochs_completed)\n"
        "loader = iter(DataLoader(data, batch_sampler=sampler))\n"
        "next(loader)\n"
        "try:\n"
        "    next(loader)\n"
        "except RuntimeError as e:\n"
        "    print('unreported:', e)\n"
        "sampler.report()\n"
        "try:\n"
        "    for _ in DataLoader(data, batch_sampler=sampler, num_workers=2):\n"
        "        sampler.report()\n"
        "except RuntimeError as e:\n"
        "    print('workers:', str(e).splitlines()[0][:60])\n"
        "for args, kwargs in (((65,), {}), ((data, 32), {}), ((data,), {'policy': 'equal'}),\n"
        "                     ((data,), {'colour': 1})):\n"
        "    try:\n"
        "        railshard.ThroughputSampler(*args, group=group, **kwargs)\n"
        "    except (ValueError, TypeError) as e:\n"
        "        print(type(e).__name__ + ':', e)\n"
        "group.close()\n")
    out = _run_alone(script)
    assert "type ElasticThroughputSampler len 4" in out, out
    assert "epoch 0 steps 4 once True completed 1" in out, out
    assert "epoch 1 steps 4 once True completed 2" in out, out
    assert ("unreported: ThroughputSampler: the next step was asked for before step 8 was "
            "reported (sampler.report()) or recovered (group.recover())") in out, out
    assert "workers: ThroughputSampler: the next step was asked for before step" in out, out
    assert ("ValueError: ThroughputSampler: the dataset has 65 samples but the ElasticGroup "
            "dispatches 64") in out, out
    assert ("ValueError: ThroughputSampler: global_batch_size 32 differs from the "
            "ElasticGroup's 16") in out, out
    assert ("ValueError: ThroughputSampler: policy come(s) from the ElasticGroup over an "
            "elastic group; set them there") in out, out
    assert "TypeError: ThroughputSampler: unexpected argument(s) colour" in out, out


STORE = tool("railshard-store")


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
@pytest.mark.skipif(not STORE.exists(), reason=f"{STORE} not built")
def test_on_two_emulated_hosts_a_hand_restarted_rank_rejoins():
    # benchmarks/elastic_restart.sh 2x2: two hosts of the namespace test bed (own host names,
    # two rails), two ranks each started by hand, the store in railshard-store on host 0;
    # rank 2 on host 1 is SIGKILLed after step 12 and started again there with
    # RAILSHARD_JOIN=1. The survivors span both hosts (shared memory inside host 0, TCP
    # rails between), and so does the grown group.
    env = launch_env()
    env["RAILSHARD_BENCH_PYTHON"] = sys.executable
    proc = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "elastic_restart.sh"),
         "installed" if INSTALLED else str(BUILD_PYTHON.parent), "1",
         "2x2"], env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert re.search(r"railshard trial 0: joined before step \d+; .*; ledgers all exactly once; "
                     r"replicas agree", out), out
    for row in ("kill -> first step on 3 ranks", "start -> first step on 4 ranks",
                "kill -> first step on 4 ranks"):
        assert re.search(rf"railshard {row} \(s\) +n=1 ", out), out
