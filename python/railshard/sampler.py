"""ThroughputSampler: each step, each rank gets its share of the global batch.

A drop-in for ``DistributedSampler`` on ranks that are not equally fast. Every rank holds its
own ``railshard._C.Dispatcher`` (pure logic, docs/dispatch.md) and feeds it the same calls in
the same order, so every rank computes the same plan without a coordinator. Shares differ
from rank to rank and from step to step, so the sampler is a *batch* sampler::

    sampler = railshard.ThroughputSampler(dataset, global_batch_size=256)
    loader = DataLoader(dataset, batch_sampler=sampler)

Gradients of unequal shares must be weighted by sample count (``railshard.hooks``).
See docs/pytorch.md for the whole recipe.
"""

from __future__ import annotations

import collections
import math
import sys
import warnings
from typing import Deque, Iterator, List, Optional, Sized, Tuple, Union

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from .signals import RankSignals


def d_names() -> List[str]:
    from . import _C

    return list(_C.LOAD_SIGNALS)

# A loop that yields this many steps without a report() is not reporting: local_samples and
# the gradient weights follow report() calls, so they would be stale. No DataLoader
# prefetches this deep (prefetch_factor * num_workers, 2 * workers by default).
_UNREPORTED_WARNING = 64


def epoch_order(size: int, shuffle: bool, seed: int, epoch: int) -> List[int]:
    """The dataset's order in an epoch: a permutation from a ``torch.Generator`` seeded
    ``seed + epoch`` (the same on every rank), or 0..size-1 without shuffle. Shared by
    ThroughputSampler and ElasticGroup, so both hand out an epoch alike."""
    if not shuffle:
        return list(range(size))
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(size, generator=generator).tolist()


class _Step:
    """One planned step as every rank sees it."""

    __slots__ = ("number", "samples", "padded", "ranges", "failed")

    def __init__(self, number: int, samples: List[int], padded: bool,
                 ranges: List[Tuple[int, int]]) -> None:
        self.number = number  # plans made before this one, all epochs
        self.samples = samples  # per rank; 0 for a rank that only got padding
        self.padded = padded  # this rank's batch is one padding sample of weight 0
        self.ranges = ranges  # every rank's epoch positions (given back if the step fails)
        self.failed = False  # this rank ran out of memory in it (out_of_memory())


def _railshard_error(name: str) -> type:
    # Looked up late: the package imports this module while it is being initialised.
    package = sys.modules.get(__package__ or "railshard")
    return getattr(package, name, RuntimeError)


class ThroughputSampler(Sampler[List[int]]):
    """Batch sampler that sizes every rank's batch by its measured throughput.

    Args:
        dataset: the dataset (anything with ``len``) or its length.
        global_batch_size: samples per step over all ranks together.
        group: process group (default: the world); rank and size come from it, and
            ``report()`` all-gathers over it. Use the group your DDP model uses. An
            ``ElasticGroup`` instead makes an elastic sampler whose steps the group plans
            (``state``: what joiners are handed; elastic_sampler.py, docs/pytorch.md).
        num_replicas, rank: override the group's size and rank (as in DistributedSampler);
            ``report()`` still needs the group when ``num_replicas > 1``.
        shuffle, seed: a permutation of the dataset per epoch from a ``torch.Generator``
            seeded ``seed + epoch`` (call ``set_epoch``), the same on every rank.
        drop_last: drop the epoch's last, incomplete global batch.
        micro_batch: shares are whole micro-batches (the epoch's tail excepted).
        min_micro_batches: micro-batches every rank gets per step when the batch allows.
            The default 1 keeps every rank measured: a rank with no samples reports no
            speed, so a rank that once looked slow could never win work back.
        policy: "proportional" (default), "round_robin" (alias "equal"),
            "weighted_round_robin" or "least_loaded" (docs/dispatch.md).

    Every dataset index appears in exactly one rank's batch once per epoch (with
    ``drop_last``, all but the dropped tail). Call ``report(seconds)`` once per step, after
    the step, on every rank: it is how the sampler learns speeds *and* which step the loop
    is on (``local_samples``, ``loss_scale``, the hook), since a DataLoader with workers
    iterates the sampler ahead of the loop (prefetch_factor * num_workers batches): the
    weights stay exact, but a report reaches the plans only after the batches already
    prefetched, so adaptation lags by the prefetch depth.
    """

    def __new__(cls, *args, group=None, **kwargs):
        # Over an ElasticGroup the steps come from the group (elastic_sampler.py).
        from .elastic import ElasticGroup

        if cls is ThroughputSampler and isinstance(group, ElasticGroup):
            from .elastic_sampler import ElasticThroughputSampler

            return super().__new__(ElasticThroughputSampler)
        return super().__new__(cls)

    def __init__(
        self,
        dataset: Union[Sized, int],
        global_batch_size: int,
        *,
        group: Optional["dist.ProcessGroup"] = None,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        micro_batch: int = 1,
        min_micro_batches: int = 1,
        policy: str = "proportional",
        energy_budget: float = 1.05,
    ) -> None:
        # Sampler.__init__ only stores (or warns about) a data_source; nothing to inherit.
        size = dataset if isinstance(dataset, int) else len(dataset)
        if size < 0:
            raise ValueError(f"ThroughputSampler: dataset length {size} < 0")
        if global_batch_size < 1:
            raise ValueError(f"ThroughputSampler: global_batch_size {global_batch_size} < 1")
        if num_replicas is None or rank is None:
            if not (dist.is_available() and dist.is_initialized()):
                raise RuntimeError(
                    "ThroughputSampler: torch.distributed is not initialised; call "
                    "init_process_group first or pass num_replicas and rank"
                )
            if num_replicas is None:
                num_replicas = dist.get_world_size(group)
            if rank is None:
                rank = dist.get_rank(group)
        if not 0 <= rank < num_replicas:
            raise ValueError(f"ThroughputSampler: rank {rank} not in [0, {num_replicas})")
        if global_batch_size < num_replicas * micro_batch:
            warnings.warn(
                f"ThroughputSampler: a global batch of {global_batch_size} cannot give each "
                f"of {num_replicas} ranks a micro-batch of {micro_batch}: some ranks get a "
                f"padding sample of weight 0 every step",
                stacklevel=2,
            )

        self.dataset_len = size
        self.global_batch_size = global_batch_size
        self.group = group
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        # With drop_last the dispatcher's epoch is the whole batches only.
        self._epoch_size = size - size % global_batch_size if drop_last else size
        self._steps = -(-self._epoch_size // global_batch_size)  # ceil

        from . import _C  # the C++ extension (built by CMake)

        self.dispatcher = (
            _C.Dispatcher(num_replicas, self._epoch_size, policy, micro_batch, min_micro_batches,
                          energy_budget)
            if self._epoch_size > 0
            else None
        )
        self._planned = 0  # plans made, all epochs: the step number of the next plan
        self._issued: Deque[_Step] = collections.deque()  # yielded, not yet reported
        self._last: Optional[_Step] = None  # the step planned most recently
        # Gathered reports waiting for the plan they belong before: (plan number, samples per
        # rank, seconds per rank, each rank's signals row, the ranges to give back when the
        # step failed or None). See report().
        self._pending: Deque[Tuple[int, List[int], List[float], List[List[float]],
                                   Optional[List[Tuple[int, int]]]]] = collections.deque()
        self._warned = False
        self._grads_ready_at: Optional[float] = None  # set by weighted_allreduce_hook
        self._reported_seconds: List[float] = []
        self._signals = None  # signals.RankSignals, made at the first report
        self._previous_order: List[int] = []  # the last iteration's (for steps given back)
        self._give_back: List[List[Tuple[int, int]]] = []  # failed steps' ranges, applied

    # -- DistributedSampler's interface --------------------------------------------------

    def __len__(self) -> int:
        """Steps per epoch (batches this rank yields; the same on every rank)."""
        return self._steps

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch's permutation; call before iterating, with the same value on
        every rank."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[List[int]]:
        order = self._order()
        # Steps of an earlier iteration that were never reported (the loop broke off while
        # the DataLoader had prefetched) were never trained on.
        self._issued.clear()
        if self.dispatcher is None:
            return
        d = self.dispatcher
        if d.step_open():
            d.complete_step()
        # The loop reported every step of the last iteration: a step that failed at its end
        # (out of memory) gave its samples back, which belong to that epoch's order.
        self._apply_due()
        while d.has_returned():
            yield self._plan(self._previous_order)
            d.complete_step()
            self._apply_due()
        d.new_epoch()
        self._previous_order = order
        while True:
            # The previous step was handed out; completing it only moves the dispatcher's
            # books (it need not wait for a report: a loop that never reports still runs).
            if d.step_open():
                d.complete_step()
            self._apply_due()
            if d.assigned_all():
                return
            yield self._plan(order)

    def _plan(self, order: List[int]) -> List[int]:
        if self._planned == 0:
            # The first step's memory is measured from here: its cap holds from the second.
            self._rank_signals().memory.first_step_starts()
        d = self.dispatcher
        ranges = d.plan(self.global_batch_size)
        samples = [int(n) for n in d.samples()]
        mine = [i for begin, end in ranges[self.rank] for i in order[begin:end]]
        padded = not mine
        if padded:
            # This rank got no samples (batch < ranks * micro_batch, or the epoch's tail). DDP
            # needs every rank in every backward, so it runs one sample -- the step's first --
            # that local_samples == 0 gives weight 0.
            first = min(begin for rank_ranges in ranges for begin, _ in rank_ranges)
            mine = [order[first]]
        step = _Step(self._planned, samples, padded,
                     [tuple(r) for rank_ranges in ranges for r in rank_ranges])
        self._planned += 1
        self._last = step
        self._issued.append(step)
        if len(self._issued) > _UNREPORTED_WARNING and not self._warned:
            self._warned = True
            warnings.warn(
                f"ThroughputSampler: {len(self._issued)} steps yielded without report(); "
                "call sampler.report(seconds) (or report() without a measurement) once "
                "per step — local_samples and the gradient weights follow it",
                stacklevel=3,
            )
        return mine

    # -- the current step ---------------------------------------------------------------

    def _current(self) -> Optional[_Step]:
        # The step the loop is on: the oldest one it has not reported. A DataLoader with
        # workers has already taken later ones (prefetch).
        if self._issued:
            return self._issued[0]
        return self._last

    @property
    def step(self) -> int:
        """Number of the current step (counted over all epochs); -1 before the first."""
        current = self._current()
        return -1 if current is None else current.number

    @property
    def shares(self) -> List[int]:
        """Samples per rank in the current step (0 for a rank that got only padding)."""
        current = self._current()
        return [0] * self.num_replicas if current is None else list(current.samples)

    @property
    def local_samples(self) -> int:
        """This rank's samples in the current step (0 when its batch is padding, or after
        ``out_of_memory()``: its gradient then weighs nothing)."""
        current = self._current()
        return 0 if current is None or current.failed else current.samples[self.rank]

    @property
    def global_samples(self) -> int:
        """Samples of the current step over all ranks."""
        current = self._current()
        return 0 if current is None else sum(current.samples)

    @property
    def padded(self) -> bool:
        """This rank's current batch is a padding sample of weight 0."""
        current = self._current()
        return current is not None and current.padded

    @property
    def memory_cap(self) -> int:
        """The most samples this rank's memory holds in one step, as it reported last
        (docs/pytorch.md, "Memory"); 0 while unknown."""
        return self._signals.last_cap if self._signals is not None else 0

    @property
    def memory_peak(self) -> float:
        """The most memory any step took on this rank so far (bytes: the GPU's allocated, or
        resident memory on the CPU); 0 before the first report."""
        return self._signals.memory.highest_peak if self._signals is not None else 0.0

    @property
    def memory_limit(self) -> float:
        """The memory this rank may use (bytes: its GPU's, or its cgroup's /
        RAILSHARD_MEMORY_LIMIT / the RAM), as it reported last; 0 before the first report."""
        return self._signals.last_limit if self._signals is not None else 0.0

    @property
    def grads_ready_at(self) -> Optional[float]:
        """``time.perf_counter()`` when ``weighted_allreduce_hook`` last ran: the end of
        this rank's backward compute, before it waits for the other ranks' gradients."""
        return self._grads_ready_at

    @property
    def reported_seconds(self) -> List[float]:
        """Every rank's seconds from the last ``report()`` (NaN where none), for logging."""
        return list(self._reported_seconds)

    # -- measurement --------------------------------------------------------------------

    def out_of_memory(self) -> None:
        """This rank's current step ran out of memory (``railshard.is_out_of_memory(e)``).

        Call it where the error was caught, then run a backward on one sample (``x[:1]``) so
        that the step's gradient all-reduce completes on every rank: its weight is 0 from
        here. ``report()`` of this step then returns False on every rank -- skip the
        optimizer step -- and the step's samples are planned again, with this rank's share
        capped below the one that failed (docs/pytorch.md, "Memory")."""
        current = self._current()
        if current is None or not self._issued:
            raise RuntimeError("ThroughputSampler.out_of_memory: no step is open")
        self._rank_signals().out_of_memory(current.samples[self.rank])
        current.failed = True
        if self._device().type == "cuda":
            torch.cuda.empty_cache()

    def report(self, seconds: Optional[float] = None, *,
               queued_samples: Optional[float] = None) -> bool:
        """Ends the current step: its compute time on this rank, or None if not measured;
        `queued_samples`: work waiting at this rank before it can start the next step (for
        ``least_loaded``: e.g. the time it waited for its DataLoader times its samples/s).
        Returns whether the step stands: False on every rank when a rank ran out of memory
        in it (``out_of_memory()``) -- then skip the optimizer step; its samples come again.

        Collective over ``group``: every rank calls it once per step, in step order. Pass
        the time this rank computed (forward and backward), not the time it waited for the
        others — under DDP, ``backward()`` returns only after the gradient all-reduce, so
        timing around it measures the slowest rank; use ``grads_ready_at`` (set by the
        hook) as the end instead. It also reads this rank's load signals (memory, CPU
        quota, GPU, power: railshard._C.LoadMonitor) and its memory cap, which every rank's
        plans then follow.
        """
        if not self._issued:
            raise RuntimeError("ThroughputSampler.report: no step to report (iterate first)")
        step = self._issued.popleft()
        try:
            value = math.nan if seconds is None else float(seconds)
        except (TypeError, ValueError):
            value = math.nan
        invalid = seconds is not None and not (math.isfinite(value) and value >= 0)
        if invalid:
            value = math.nan  # join the collective anyway; raise after it (no hang)
        signal_row = self._rank_signals().row(0 if step.failed else step.samples[self.rank],
                                              queued_samples)

        # Every rank sends (seconds, plans made, step reported, failed, signals...).
        mine = [value, float(self._planned), float(step.number), float(step.failed)] + signal_row
        if self.num_replicas == 1:
            rows = [mine]
        else:
            device = self._device()
            local = torch.tensor(mine, dtype=torch.float64, device=device)
            gathered = [torch.empty_like(local) for _ in range(self.num_replicas)]
            dist.all_gather(gathered, local, group=self.group)
            rows = [t.tolist() for t in gathered]

        steps = [int(row[2]) for row in rows]
        if any(s != steps[0] for s in steps):
            raise _railshard_error("MismatchError")(
                "ThroughputSampler.report: ranks report different steps "
                + ", ".join(f"rank {r}: step {s}" for r, s in enumerate(steps))
                + " (call report() exactly once per step on every rank)"
            )
        failed = any(row[3] != 0 for row in rows)
        # Ranks may have planned different numbers of steps (one DataLoader prefetches more
        # than another, or has not asked yet). Every rank applies this report just before
        # the same plan — the next plan of the rank that is furthest ahead — so all
        # dispatchers see the same calls in the same order and stay identical.
        apply_at = max(int(row[1]) for row in rows)
        self._reported_seconds = [row[0] for row in rows]
        self._pending.append((apply_at, step.samples, self._reported_seconds,
                              [row[4:] for row in rows], step.ranges if failed else None))
        self._apply_due()
        if (
            self.dispatcher is not None
            and self.dispatcher.step_open()
            and step.number == self._planned - 1
        ):
            self.dispatcher.complete_step()  # the loop has caught up with the plans
            self._apply_due()  # a failed step's samples go back now
        if invalid:
            raise ValueError(f"ThroughputSampler.report: seconds={seconds!r} (need a number >= 0)")
        return not failed

    def _apply_due(self) -> None:
        d = self.dispatcher
        while self._pending and self._pending[0][0] <= self._planned:
            if self._give_back and d is not None and d.step_open():
                return  # steps given back go in between two plans, in order
            _, samples, seconds, signal_rows, give_back = self._pending.popleft()
            if d is None:
                continue
            names = d_names()
            for r, row in enumerate(signal_rows):
                d.set_load(r, dict(zip(names, row[1:])))
                if give_back is None and math.isfinite(seconds[r]):  # NaN: measured nothing
                    d.report(r, float(samples[r]), seconds[r], row[0])
            if give_back is not None:
                self._give_back.append(give_back)
            if dist.is_available() and dist.is_initialized():
                d.export_metrics(self.rank, dist.get_rank())
        if d is not None and not d.step_open():
            while self._give_back:
                d.requeue(self._give_back.pop(0))

    def _order(self) -> List[int]:
        return epoch_order(self.dataset_len, self.shuffle, self.seed, self.epoch)[
            : self._epoch_size
        ]

    def _device(self) -> torch.device:
        # NCCL gathers only CUDA tensors; every other backend (railshard, gloo, mpi) takes CPU.
        if dist.is_initialized() and str(dist.get_backend(self.group)) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _rank_signals(self) -> RankSignals:
        # The memory that limits a step is the GPU's once this process uses one.
        if self._signals is None:
            on_gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
            self._signals = RankSignals(
                torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu"))
        return self._signals

    def __repr__(self) -> str:
        return (
            f"ThroughputSampler(len={self.dataset_len}, global_batch_size="
            f"{self.global_batch_size}, rank={self.rank}/{self.num_replicas}, epoch={self.epoch})"
        )
