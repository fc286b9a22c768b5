"""Data-parallel training with railshard: DDP + ThroughputSampler + weighted gradients.

A small MLP learns a synthetic classification task. Each rank's share of every global
batch follows its measured speed; ``--slow-rank R --slow-factor F`` makes rank R emulate a
GPU F times slower (it sleeps in proportion to its samples), and rank 0 logs every step's
shares and compute times, so you can watch the shares move.

    PYTHONPATH=build/python build/launcher/tools/railshard-launch -n 4 \\
        /usr/bin/python3 examples/train.py --slow-rank 1 --slow-factor 3
    PYTHONPATH=build/python torchrun --nproc_per_node 4 examples/train.py
    PYTHONPATH=build/python mpirun -n 4 -x PYTHONPATH python3 examples/train.py

With ``--elastic`` the same training survives a lost rank and takes a restarted one back
(railshard.ElasticGroup + ElasticDataParallel; a ledger proves every sample once per epoch):

    PYTHONPATH=build/python build/launcher/tools/railshard-launch -n 4 --max-restarts 1 \\
        /usr/bin/python3 examples/train.py --elastic --kill 2:12

See docs/pytorch.md.
"""

import time

# Before the imports: restart figures count from the process's start, torch's import included.
STARTED_US = time.time_ns() // 1000

import argparse  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    import railshard
except ImportError:  # run from a checkout without PYTHONPATH: try the default build tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build",
                                    "python"))
    import railshard


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="railshard", choices=["railshard", "gloo"])
    p.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    p.add_argument("--batch", type=int, default=512, help="global batch size (default 512)")
    p.add_argument("--samples", type=int, default=16384, help="dataset size (default 16384)")
    p.add_argument("--hidden", type=int, default=256, help="MLP width (default 256)")
    p.add_argument("--policy", default="proportional",
                   help="proportional, round_robin, weighted_round_robin, least_loaded")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--weighting", default="hook", choices=["hook", "loss_scale"],
                   help="how gradients are weighted by sample count (default hook)")
    p.add_argument("--sample-ms", type=float, default=1.0,
                   help="emulated compute per sample and rank, ms (default 1; 0: none)")
    p.add_argument("--slow-rank", type=int, default=-1, help="rank that emulates a slower GPU")
    p.add_argument("--slow-factor", type=float, default=1.0, help="how much slower (e.g. 3)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader workers")
    p.add_argument("--quiet", action="store_true", help="log a summary only")
    p.add_argument("--kill", default="", metavar="RANK:STEP[:backward]",
                   help="rank RANK SIGKILLs itself after step STEP, in its first start only "
                        "(to time a launcher's restart: benchmarks/torchrun_restart.sh); "
                        "with :backward (--elastic), in the step, after its backward pass")
    p.add_argument("--elastic", action="store_true",
                   help="railshard.ElasticGroup + ElasticDataParallel: survive a lost rank "
                        "and admit a restarted one (railshard-launch --max-restarts K), with a "
                        "ledger of every sample processed")
    p.add_argument("--compare", default="", metavar="P,Q",
                   help="train under each policy in turn (same model, same batches) and "
                        "compare step times and eval loss (examples/compare_policies.py); "
                        "run it under railshard-launch --emulate-speeds")
    p.add_argument("--plot", default="", metavar="FILE.png",
                   help="--compare: draw shares and step times over the steps")
    p.add_argument("--activation-kib", type=int, default=0, metavar="K",
                   help="a model that keeps K KiB of activations per sample for its backward "
                        "at little compute (the memory caps' demonstration)")
    p.add_argument("--oom", default="", metavar="RANK:STEP",
                   help="rank RANK's allocator fails in step STEP (a real out-of-memory error): "
                        "the step is given back and planned again with that rank capped")
    p.add_argument("--ledger", action="store_true",
                   help="check that the samples trained on are the epoch's first ones, each "
                        "once (after steps given back, too)")
    p.add_argument("--save", default="", metavar="FILE",
                   help="--elastic: rank 0 saves the final parameters and the steps' sample "
                        "order to FILE (torch.save), for a reference to check")
    return p.parse_args()


class IndexedTask(torch.utils.data.Dataset):
    """A task's samples with their dataset index, for the ledger."""

    def __init__(self, task):
        self.task = task

    def __len__(self):
        return len(self.task)

    def __getitem__(self, i):
        return self.task.x[i], self.task.y[i], i


class SyntheticTask(torch.utils.data.Dataset):
    """Random inputs labelled by a fixed random linear map: learnable, same on every rank."""

    def __init__(self, samples, features=64, classes=10, seed=1234):
        g = torch.Generator()
        g.manual_seed(seed)
        self.x = torch.randn(samples, features, generator=g)
        self.y = (self.x @ torch.randn(features, classes, generator=g)).argmax(dim=1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def restart_count():
    """How many times the launcher restarted this process (torchrun counts; railshard-launch
    --max-restarts marks a restarted rank with RAILSHARD_JOIN=1)."""
    if os.environ.get("RAILSHARD_JOIN") == "1":
        return 1
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def wall_us():
    return time.time_ns() // 1000


def main():
    started_us = STARTED_US
    args = parse_args()
    kill, kill_in_backward = None, False
    if args.kill:
        parts = args.kill.split(":")
        kill_in_backward = len(parts) == 3 and parts[2] == "backward"
        try:
            assert len(parts) == 2 or kill_in_backward
            kill = (int(parts[0]), int(parts[1]))
        except (ValueError, AssertionError):
            sys.exit(f"train.py: --kill expects RANK:STEP or RANK:STEP:backward, got "
                     f"{args.kill!r}")
        if kill_in_backward and not args.elastic:
            sys.exit("train.py: --kill RANK:STEP:backward needs --elastic")
    args.kill_in_backward = kill_in_backward
    torch.set_num_threads(1)  # several ranks share this host's cores
    if args.elastic:
        return main_elastic(args, kill, started_us)
    if args.compare:
        import compare_policies  # beside this script

        return compare_policies.run(args, SyntheticTask(args.samples), make_model)
    # dist.init_process_group after filling RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from
    # the launcher's variables where missing (mpirun, srun); railshard-launch and torchrun
    # export torch's own.
    railshard.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    task = SyntheticTask(args.samples)
    data = IndexedTask(task)
    model = make_model(args.hidden, args.activation_kib)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    oom = tuple(int(v) for v in args.oom.split(":")) if args.oom else None
    processed = torch.zeros(len(data), dtype=torch.int32)  # the ledger: this rank's samples
    given_back = 0
    sampler = railshard.ThroughputSampler(data, args.batch, micro_batch=args.micro_batch,
                                          policy=args.policy)
    if args.weighting == "hook":
        ddp.register_comm_hook(sampler, railshard.weighted_allreduce_hook)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler,
                                         num_workers=args.num_workers)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    per_sample_s = args.sample_ms / 1000 * (args.slow_factor if rank == args.slow_rank else 1)

    if rank == 0:
        print(f"train.py: {world} ranks, backend {args.backend}, global batch {args.batch}, "
              f"{args.steps} steps, weighting {args.weighting}, policy {args.policy}"
              + (f", rank {args.slow_rank} {args.slow_factor}x slower"
                 if 0 <= args.slow_rank < world else ""), flush=True)
    step, epoch, step_times, attempts = 0, 0, [], 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y, index in loader:
            started = time.perf_counter()
            attempts += 1
            try:
                if oom == (rank, attempts - 1):
                    torch.empty(1 << 62, dtype=torch.uint8)  # the allocator cannot: a real OOM
                loss = raw_loss = F.cross_entropy(ddp(x), y)
                # The emulated GPU: time in proportion to this rank's samples.
                time.sleep(per_sample_s * sampler.local_samples)
                if args.weighting == "loss_scale":
                    loss = loss * railshard.loss_scale(sampler)
                    # backward() waits for the all-reduce, i.e. for the slowest rank: time up
                    # to here. Backward costs about as much per sample as forward, so the
                    # ratios between ranks (all the dispatcher needs) stay right.
                    computed = time.perf_counter() - started
                optimizer.zero_grad()
                loss.backward()
            except RuntimeError as e:
                if not railshard.is_out_of_memory(e):
                    raise
                # This rank's share did not fit: give the step up (on every rank, at report)
                # and take part in its all-reduce with one sample of weight 0.
                print(f"train.py: rank {rank} ran out of memory in step {step}: "
                      f"{str(e).splitlines()[0][:120]}", flush=True)
                sampler.out_of_memory()
                optimizer.zero_grad()
                loss = raw_loss = F.cross_entropy(ddp(x[:1]), y[:1])
                loss.backward()
            if args.weighting == "hook":
                # The hook stamped the end of this rank's backward compute, before the wait.
                computed = sampler.grads_ready_at - started
            shares = sampler.shares
            local = sampler.local_samples
            # Collective: every rank, once per step; False when a rank gave the step up.
            if not sampler.report(computed):
                given_back += 1
                if rank == 0:
                    print(f"train.py: step {step} given up (a rank ran out of memory); its "
                          f"samples are planned again", flush=True)
                continue
            optimizer.step()
            if local > 0:
                processed[index] += 1
            step_times.append(time.perf_counter() - started)
            if rank == 0 and not args.quiet:
                ms = " ".join(f"{s * 1000:6.1f}" for s in sampler.reported_seconds)
                print(f"step {step:4d} epoch {epoch} | shares {' '.join(f'{n:4d}' for n in shares)}"
                      f" | compute ms {ms} | step {step_times[-1] * 1000:6.1f} ms"
                      f" | loss {raw_loss.item():.4f}", flush=True)
            if len(step_times) == 1 and rank == 0 and restart_count() > 0:
                # When the restarted job is going again (one host, one wall clock).
                print(f"train.py: first step after restart {restart_count()} (step {step}) done "
                      f"at {wall_us()} us; process started at {started_us} us", flush=True)
            if kill and kill == (rank, step) and restart_count() == 0:
                print(f"train.py: rank {rank} kills itself after step {step} at {wall_us()} us",
                      flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            step += 1
            if step == args.steps:
                break
        epoch += 1

    if rank == 0:
        half = step_times[len(step_times) // 2:]
        ideal = ""
        if args.sample_ms > 0:
            speeds = [1 / (args.slow_factor if r == args.slow_rank else 1) for r in range(world)]
            ideal_s = args.batch * args.sample_ms / 1000 / sum(speeds)
            ideal = f" (emulated compute alone: {ideal_s * 1000:.1f} ms)"
        print(f"train.py: done; median step over the last {len(half)} steps "
              f"{statistics.median(half) * 1000:.1f} ms{ideal}; last shares {shares}", flush=True)
    if args.ledger:
        dist.all_reduce(processed)
        if rank == 0:
            # The steps that stood cover the first positions of the epoch's order, each once.
            order = railshard.sampler.epoch_order(len(data), True, 0, 0)
            done = int((processed > 0).sum())
            first = torch.tensor(order[:done])
            exact = int(processed.max()) <= 1 and bool((processed[first] == 1).all())
            print(f"train.py: ledger: {done} samples in {step} steps ({given_back} given up and "
                  f"planned again): " + ("each of the epoch's first once" if exact else
                                         "NOT each once"), flush=True)
    print(f"train.py: rank {rank} peak memory {sampler.memory_peak / 2**20:.0f} MiB of "
          f"{sampler.memory_limit / 2**20:.0f} MiB it may use; memory cap {sampler.memory_cap} "
          f"samples", flush=True)
    dist.barrier()
    dist.destroy_process_group()


class ActivationHeavy(torch.nn.Module):
    """64 -> hidden -> (hidden repeated to K KiB, scaled, averaged back) -> 10: the repeated
    copy is kept for the backward pass, so memory per sample is about K KiB while the compute
    stays that of the small MLP."""

    def __init__(self, hidden, kib):
        super().__init__()
        self.first = torch.nn.Linear(64, hidden)
        self.repeats = max(kib * 256 // hidden, 1)
        self.scale = torch.nn.Parameter(torch.ones(hidden * self.repeats))
        self.last = torch.nn.Linear(hidden, 10)

    def forward(self, x):
        h = F.relu(self.first(x))
        big = h.repeat(1, self.repeats) * self.scale
        return self.last(big.view(len(x), self.repeats, -1).mean(1))


def make_model(hidden, activation_kib=0):
    torch.manual_seed(0)  # the launch's ranks take rank 0's parameters anyway
    if activation_kib > 0:
        return ActivationHeavy(hidden, activation_kib)
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10))


def main_elastic(args, kill, started_us):
    """The same training as main(), elastic: ranks may die and be restarted while it runs.

    Each step: the DataLoader asks the elastic ThroughputSampler for a batch, which runs the
    step boundary (sync: admit joiners, or receive the state as one) and plans this rank's
    share (next_step); forward/backward (ElasticDataParallel all-reduces the weighted
    gradients), then an all-reduce of which samples each rank processed into the ledger, the
    optimizer step, sampler.report() (the commit). A lost peer anywhere in it: recover() and
    the step is redone by the survivors.
    The ledger travels with the model and optimizer in the state a joiner is handed (and a
    survivor that applied one step too many is given back), so at every epoch's end it says
    whether each sample was processed exactly once."""
    data = SyntheticTask(args.samples)
    # The model first: a joiner's time between joining and its first sync() holds the
    # members up (they wait to hand it the state), so it prepares before it joins.
    model = make_model(args.hidden)
    imported_us = wall_us()
    group = railshard.ElasticGroup(len(data), args.batch, micro_batch=args.micro_batch,
                                   policy=args.policy)
    if group.joined:
        # Where a restart's time goes: the imports, then ElasticGroup() (DDP's lazy imports,
        # asking to join, the members' next step boundary, connecting).
        print(f"train.py: joined the running job as launch rank {group.launch_rank}: imports "
              f"{(imported_us - started_us) / 1e6:.3f} s, ElasticGroup() "
              f"{(wall_us() - imported_us) / 1e6:.3f} s", flush=True)
    ddp = railshard.ElasticDataParallel(model, group)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    slot = int(os.environ.get("RAILSHARD_RANK", group.launch_rank))  # the launcher's slot
    per_sample_s = args.sample_ms / 1000 * (args.slow_factor if slot == args.slow_rank else 1)
    state = {"model": model, "optimizer": optimizer,
             "ledger": torch.zeros(len(data), dtype=torch.int32), "epochs_checked": 0,
             "steps": []}  # steps: [epoch, first position, samples] of each committed step
    log = group.rank == 0 and not args.quiet
    if group.rank == 0 and not group.joined:
        print(f"train.py --elastic: {group.size} ranks, global batch {args.batch}, "
              f"{args.steps} steps, policy {args.policy}", flush=True)
    # One step at a time (the group cannot plan ahead), so no worker processes.
    sampler = railshard.ThroughputSampler(data, group=group, state=state)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler)
    batches = iter(loader)
    # After a change of membership, rank 0 stamps the first step done on the new group; a
    # joiner stamps its first step and when its process started (one host, one clock).
    after = "joining" if group.joined else None
    while group.committed_steps < args.steps:
        step = group.committed_steps
        step_started = time.perf_counter()
        changes = len(group.changes)
        try:
            batch = next(batches, None)
            if batch is None:  # the epoch's steps are done: the next iteration begins a new one
                batches = iter(loader)
                batch = next(batches)
            if len(group.changes) > changes:  # the sampler's sync() admitted joiners
                change = group.changes[-1]
                after = "growth"
                if group.rank == 0:
                    print(f"train.py: launch rank(s) {change['joined']} joined before step "
                          f"{group.committed_steps}: {group.size} ranks (grow and hand-over "
                          f"{change['seconds'] * 1000:.1f} ms) at {wall_us()} us", flush=True)
            x, y = batch
            indices = sampler.indices
            step, epoch = group.step, group.epoch
            started = time.perf_counter()
            loss = F.cross_entropy(ddp(x), y)
            time.sleep(per_sample_s * group.local_samples)  # the emulated GPU
            optimizer.zero_grad()
            loss.backward()  # the hook all-reduces the weighted gradients
            computed = time.perf_counter() - started
            if kill == (slot, step) and args.kill_in_backward and restart_count() == 0:
                print(f"train.py: rank {slot} kills itself in step {step}, after its backward, "
                      f"at {wall_us()} us", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            counts = torch.zeros(len(data), dtype=torch.int32)
            if group.local_samples > 0:
                counts[torch.tensor(indices)] += 1
            group.process_group.allreduce([counts]).wait()
            state["ledger"] += counts
            state["steps"].append([epoch, group.step_start, group.global_samples])
            optimizer.step()
            sampler.report(computed)  # commits the step
        except Exception as e:  # noqa: BLE001 (DDP re-raises a lost peer as RuntimeError)
            if not railshard.is_peer_lost(e):
                raise
            change = group.recover(state)
            batches = iter(loader)  # the redone step comes first
            del state["steps"][change["committed"]:]
            after = "the loss"
            if group.rank == 0:
                print(f"train.py: launch rank(s) {change['lost']} lost in step {step}; "
                      f"{group.size} survivors, steps 0..{change['committed'] - 1} stand, "
                      f"recovered in {change['seconds'] * 1000:.1f} ms, at {wall_us()} us "
                      f"({str(e).splitlines()[0][:160]})", flush=True)
            continue
        if log:
            print(f"step {step:4d} epoch {epoch} | ranks {group.size} | shares "
                  f"{' '.join(f'{n:4d}' for n in group.shares)} | step "
                  f"{(time.perf_counter() - step_started) * 1000:6.1f} ms | loss "
                  f"{loss.item():.4f}", flush=True)
        if after and (group.rank == 0 or after == "joining"):
            print(f"train.py: first step after {after} (step {step}, {group.size} ranks) done at "
                  f"{wall_us()} us" + (f"; process started at {started_us} us"
                                       if after == "joining" else ""), flush=True)
        after = None
        if group.epoch_done:
            ledger = state["ledger"]
            missing = int((ledger == 0).sum())
            duplicated = int((ledger > 1).sum())
            if group.rank == 0:
                print(f"# ledger: epoch {epoch}: {len(data)} samples, "
                      + ("each processed exactly once" if missing == duplicated == 0 else
                         "NOT exactly once")
                      + f" ({missing} missing, {duplicated} duplicated)", flush=True)
            state["ledger"] = torch.zeros(len(data), dtype=torch.int32)
            state["epochs_checked"] += 1
        if kill == (slot, step) and not args.kill_in_backward and restart_count() == 0:
            print(f"train.py: rank {slot} kills itself after step {step} at {wall_us()} us",
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    # Every rank's, to show the replicas agree (a joiner's included).
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    print(f"train.py: launch rank {group.launch_rank} parameter checksum {checksum:.12g}",
          flush=True)
    if group.rank == 0:
        print(f"train.py: done; {group.committed_steps} steps on {group.size} ranks, "
              f"{len(group.changes)} membership change(s)", flush=True)
        if args.save:
            torch.save({"params": [p.detach().clone() for p in model.parameters()],
                        "steps": state["steps"], "lr": args.lr, "hidden": args.hidden,
                        "samples": args.samples}, args.save)
    group.close()


if __name__ == "__main__":
    main()
