"""Elastic training in PyTorch: ranks leave (a failure) and join (a restart, a new server) a
running job, and training goes on -- no restart of the survivors, no sample of the epoch lost
or done twice.

    group = railshard.ElasticGroup(len(dataset), global_batch_size=256, micro_batch=8)
    model = railshard.ElasticDataParallel(net, group)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    state = {"model": net, "optimizer": optimizer}       # what a joiner is handed
    while group.committed_steps < steps:
        try:
            group.sync(state)                            # admit joiners / receive as one
            indices = group.next_step()                  # this rank's share of the step
            optimizer.zero_grad()
            loss_fn(model(x[indices]), y[indices]).backward()  # weighted all-reduce
            optimizer.step()
            group.commit(seconds)                        # this rank's compute time
        except Exception as e:
            if not railshard.is_peer_lost(e):
                raise
            group.recover(state)                         # shrink; the step is redone

Run it under ``railshard-launch --elastic --max-restarts K``: a killed rank is restarted with
RAILSHARD_JOIN=1, its ElasticGroup joins the running job, and the members admit it at their
next ``sync()``. torch's ProcessGroup has a fixed rank and size, so a membership change
builds a new one over the re-formed communicator (``group.process_group``); DDP itself stays
in place: ElasticDataParallel is a DDP whose gradient all-reduce (a comm hook) runs on the
group's current process group, weighted by each rank's share. See docs/pytorch.md.
"""

import datetime
import io
import os
import sys
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from .sampler import epoch_order

# Long enough for a restarted process to start (import torch, build its model) and join.
DEFAULT_TIMEOUT = datetime.timedelta(seconds=60)


def _errors():
    return sys.modules[__package__ or "railshard"]


def is_peer_lost(error: BaseException) -> bool:
    """True for an error ``ElasticGroup.recover()`` answers: a lost peer, or a timeout (a
    rank that never came). DDP re-raises a failed all-reduce as a plain RuntimeError, so the
    kind is read from railshard's message prefix too."""
    package = _errors()
    if isinstance(error, (package.PeerLostError, package.TimeoutError)):
        return True
    text = str(error)
    return "railshard PeerLostError" in text or "railshard TimeoutError" in text


class ElasticGroup:
    """The communicator of an elastic job, its current process group and (with
    ``dataset_size``) the job's dispatcher, which shares every step among the ranks by
    measured throughput and keeps the books of the epoch across failures and joins.

    Args:
        dataset_size: samples per epoch (0: no dispatcher; then ``next_step`` is not
            available and gradients are plain means).
        global_batch_size: samples per step over all ranks.
        policy, micro_batch, min_micro_batches: as for ThroughputSampler (docs/dispatch.md).
        shuffle, seed: the epoch's order is a permutation seeded ``seed + epoch``.
        timeout: per collective, and how long a joiner waits to be admitted
            (RAILSHARD_TIMEOUT overrides it).

    Forming it is collective over the ranks of the launch (``railshard.init``'s environment:
    railshard-launch, mpirun, Slurm); in a process started with RAILSHARD_JOIN=1 it joins
    the running job instead and ``joined`` is True.
    """

    def __init__(
        self,
        dataset_size: int = 0,
        global_batch_size: int = 0,
        *,
        policy: str = "proportional",
        micro_batch: int = 1,
        min_micro_batches: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        timeout: datetime.timedelta = DEFAULT_TIMEOUT,
    ) -> None:
        if dataset_size < 0:
            raise ValueError(f"ElasticGroup: dataset_size {dataset_size} < 0")
        if dataset_size > 0 and global_batch_size < 1:
            raise ValueError(f"ElasticGroup: global_batch_size {global_batch_size} < 1")
        from . import _C

        if os.environ.get("RAILSHARD_JOIN") == "1":
            # Between its admission and its first sync() a joiner holds the members up (they
            # wait in the state hand-over): pay torch's lazy imports of a first DDP (about
            # 1.5 s of torch._dynamo in torch 2.x) before asking to join.
            _warm_up_ddp()
        self._c = _C.ElasticGroup(
            timeout, bool(torch.version.cuda), dataset_size, policy, micro_batch, min_micro_batches
        )
        self.dataset_size = dataset_size
        self.global_batch_size = global_batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.joined = self._c.joined_running_job
        self._state_pending = self.joined  # a joiner is handed the state at its first sync()
        self._order: Optional[List[int]] = None
        self._order_epoch = -1
        self._padded = False
        self.changes: List[Dict[str, Any]] = []  # every shrink and grow, in order

    # -- membership ----------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._c.rank

    @property
    def size(self) -> int:
        return self._c.size

    @property
    def generation(self) -> int:
        """0 for the group the launch formed, +1 per shrink or grow."""
        return self._c.generation

    @property
    def launch_rank(self) -> int:
        """This process's number for the whole job (joiners get new ones)."""
        return self._c.launch_rank

    @property
    def launch_ranks(self) -> List[int]:
        return list(self._c.launch_ranks)

    @property
    def process_group(self) -> "dist.ProcessGroup":
        """The current generation's process group (a new one after every change: take it
        anew rather than keeping it)."""
        return self._c.process_group

    def sync(self, state: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """Step boundary, every rank: admits waiting joiners and hands them ``state`` from
        rank 0; in a joiner, its first call receives it. ``state`` maps names to objects with
        ``state_dict()``/``load_state_dict()`` (modules, optimizers, schedulers) or to plain
        values, which a receiver finds replaced in its dict. Returns the change, or None."""
        if self._state_pending:
            self._state_pending = False
            self._broadcast_state(state, 0)
            self._undo(state, {"undo": False})  # in step with the members' _undo()
            return {"lost": [], "joined": [self.launch_rank], "seconds": 0.0}
        if self._c.has_dispatcher and self._c.redo_pending:
            return None  # the step a failure left open is redone first
        if self._c.joiners_waiting() == 0:
            return None
        change = dict(self._c.grow())
        self._broadcast_state(state, 0)
        # A member that did not come to the grow (it died at the boundary) is handled as by
        # recover(): who applied one step too many takes the state back, joiners included.
        self._undo(state, change)
        self.changes.append(change)
        return change

    def recover(self, state: Dict[str, Any]) -> Dict[str, Any]:
        """After ``is_peer_lost(error)``, every survivor: the group shrinks to the survivors,
        the dispatcher agrees on the steps that stand, and a survivor that had applied one
        step more than another gets ``state`` back from one that had not. The next
        ``next_step()`` is the step to redo."""
        change = dict(self._c.shrink())
        self._undo(state, change)
        self.changes.append(change)
        return change

    def _undo(self, state: Dict[str, Any], change: Dict[str, Any]) -> None:
        # Survivors are at most one step apart; those that applied the step nobody else did
        # take the state of the first rank that did not.
        flags = torch.tensor([1 if change.get("undo") else 0], dtype=torch.int64)
        gathered = [torch.empty_like(flags) for _ in range(self.size)]
        self.process_group.allgather([gathered], [flags]).wait()
        undo = [int(t.item()) for t in gathered]
        if any(undo):
            self._broadcast_state(state, undo.index(0))

    def _broadcast_state(self, state: Dict[str, Any], src: int) -> None:
        pg = self.process_group
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        if self.rank == src:
            payload = {
                name: value.state_dict() if hasattr(value, "state_dict") else value
                for name, value in state.items()
            }
            buffer = io.BytesIO()
            torch.save(payload, buffer)
            data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
            length = torch.tensor([data.numel()], dtype=torch.int64)
        else:
            length = torch.zeros(1, dtype=torch.int64)
        pg.broadcast([length], opts).wait()
        if self.rank != src:
            data = torch.empty(int(length.item()), dtype=torch.uint8)
        pg.broadcast([data], opts).wait()
        if self.rank == src:
            return
        # The bytes come from a rank of this job (token-authenticated): full unpickling.
        payload = torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)
        for name, value in payload.items():
            target = state.get(name)
            if target is not None and hasattr(target, "load_state_dict"):
                target.load_state_dict(value)
            else:
                state[name] = value

    def close(self) -> None:
        self._c.close()

    # -- the dispatcher ------------------------------------------------------------------

    def next_step(self) -> List[int]:
        """Collective: this rank's dataset indices of the next step (the step a failure left
        open, after ``recover()``). A rank with no share gets one padding sample of weight
        0 (``local_samples`` is 0), so that it still takes part in the all-reduce."""
        if self._state_pending:
            raise RuntimeError(
                "ElasticGroup.next_step: this process joined a running job; call "
                "sync(state) first (the members hand it the state there)"
            )
        ranges = self._c.next_step(self.global_batch_size)
        order = self._epoch_order()
        mine = [i for begin, end in ranges for i in order[begin:end]]
        self._padded = not mine
        if self._padded:
            mine = [order[self.step_start]]
        return mine

    def _epoch_order(self) -> List[int]:
        epoch = self.epoch
        if self._order is None or self._order_epoch != epoch:
            self._order = epoch_order(self.dataset_size, self.shuffle, self.seed, epoch)
            self._order_epoch = epoch
        return self._order

    def commit(self, seconds: Optional[float] = None) -> None:
        """This rank's step is done and applied (its all-reduce succeeded, the optimizer
        stepped): ``seconds`` is its compute time (forward and backward, not the wait for the
        others), or None when not measured."""
        if seconds is not None:
            self._c.finish_step(float(self.local_samples), float(seconds))
        self._c.commit_step()

    @property
    def local_samples(self) -> int:
        """This rank's samples in the current step (0 when its batch is padding)."""
        return 0 if self._padded else int(self._c.my_samples)

    @property
    def global_samples(self) -> int:
        return int(self._c.step_samples)

    @property
    def shares(self) -> List[int]:
        """Samples of the current step by dispatcher rank (ranks that left hold 0)."""
        return list(self._c.shares)

    @property
    def dispatcher_launch_ranks(self) -> List[int]:
        """The launch rank of each dispatcher rank (the index into ``shares``)."""
        return list(self._c.dispatcher_launch_ranks)

    @property
    def step(self) -> int:
        return int(self._c.step)

    @property
    def step_start(self) -> int:
        """The current step's first position in the epoch's order (a step covers
        ``global_samples`` positions from there, over all ranks)."""
        return int(self._c.step_first_position)

    @property
    def epoch(self) -> int:
        return int(self._c.epoch)

    @property
    def epochs_completed(self) -> int:
        """Epochs whose every step is committed (epochs count from 0)."""
        return self.epoch + (1 if self.epoch_done else 0)

    @property
    def committed_steps(self) -> int:
        return int(self._c.committed_steps)

    @property
    def epoch_done(self) -> bool:
        return bool(self._c.epoch_done)

    @property
    def rates(self) -> List[float]:
        return list(self._c.rates)

    def gradient_weight(self) -> float:
        """What this rank's mean gradient is multiplied by before the sum: its share of the
        step (the full-batch mean; docs/pytorch.md), or 1/size without a dispatcher."""
        if not self._c.has_dispatcher:
            return 1.0 / self.size
        total = self.global_samples
        return self.local_samples / total if total > 0 else 0.0


def _solo_group():
    # DDP is built over a one-rank railshard group of this process alone: its construction
    # broadcasts and checks nothing across ranks, and its gradient all-reduce is the hook.
    from . import _C

    timeout = datetime.timedelta(seconds=60)
    if hasattr(_C, "create_named_group"):
        return _C.create_named_group(dist.HashStore(), 0, 1, timeout, False)
    return _C.create_backend(dist.HashStore(), 0, 1, timeout)


def _warm_up_ddp() -> None:
    torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1), process_group=_solo_group())


def _elastic_allreduce_hook(
    state, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    group = state
    tensor = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
    tensor.mul_(group.gradient_weight())
    work = group.process_group.allreduce([tensor])

    def _unwrap(fut: torch.futures.Future) -> torch.Tensor:
        value = fut.value()
        return value[0] if isinstance(value, (list, tuple)) else value

    return work.get_future().then(_unwrap)


class ElasticDataParallel(torch.nn.parallel.DistributedDataParallel):
    """DistributedDataParallel over an ElasticGroup: the same module, buckets and overlap of
    backward with the all-reduce, but the all-reduce runs on the group's *current* process
    group, so the wrapper survives every change of membership in place.

    Gradients are the full-batch mean of the step (each rank's weighted by its share). At
    construction the launch's ranks take rank 0's parameters and buffers (as DDP does); a
    joiner gets them, with everything else in ``state``, from ``group.sync(state)``.
    DDP's own broadcasts (construction, ``broadcast_buffers``) run over a one-rank group of
    this process: the elastic group does them (above) and the state hand-over replaces
    them for joiners. The hook's annotations are what DDP's check accepts (no
    ``from __future__ import annotations`` in this file).
    """

    def __init__(self, module: torch.nn.Module, group: ElasticGroup, **kwargs) -> None:
        # Every rank's buckets must hold the same parameters in the same order, or the
        # all-reduce adds one rank's gradient of A to another's of B. DDP lays buckets out
        # afresh after its first backward, in the order gradients became ready there; a
        # joiner's first backward runs on the first layout while the members' run on the
        # rebuilt one. With find_unused_parameters DDP keeps the first layout for good (a
        # function of the module and the bucket caps alone), at the cost of one traversal
        # of the autograd graph per step.
        for name, allowed in (("find_unused_parameters", True), ("static_graph", False)):
            if kwargs.get(name, allowed) != allowed:
                raise ValueError(
                    f"ElasticDataParallel: {name}={kwargs[name]!r} is not supported (DDP would "
                    "rebuild its buckets, and a joiner's would not match the members')"
                )
        kwargs["find_unused_parameters"] = True
        super().__init__(module, process_group=_solo_group(), **kwargs)
        self.elastic_group = group
        self.register_comm_hook(group, _elastic_allreduce_hook)
        if not group.joined and group.size > 1:
            pg = group.process_group
            opts = dist.BroadcastOptions()
            opts.rootRank = 0
            with torch.no_grad():
                for tensor in list(module.parameters()) + list(module.buffers()):
                    pg.broadcast([tensor.data], opts).wait()
