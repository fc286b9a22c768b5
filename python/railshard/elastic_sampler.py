"""ThroughputSampler over an ElasticGroup: the batch sampler of an elastic job.

``ThroughputSampler(dataset, group=elastic_group, state=state)`` returns one of these. Each
step it asks the group: ``sync(state)`` (the step boundary: joiners are admitted and handed
``state``; a joiner receives it), then ``next_step()`` (this rank's share, planned among the
ranks that are there now -- after a loss the open step is planned again among the survivors
and redone, after a grow the joiners get shares from their first step)::

    group = railshard.ElasticGroup(len(dataset), global_batch_size=256, micro_batch=8)
    model = railshard.ElasticDataParallel(net, group)
    state = {"model": net, "optimizer": optimizer}
    sampler = railshard.ThroughputSampler(dataset, group=group, state=state)
    loader = DataLoader(dataset, batch_sampler=sampler)   # num_workers=0
    while group.epochs_completed < epochs:
        try:
            for x, y in loader:                           # the rest of the epoch
                loss_fn(model(x), y).backward()
                optimizer.step()
                sampler.report(seconds)                   # commits the step
        except Exception as e:
            if not railshard.is_peer_lost(e):
                raise
            group.recover(state)                          # the loop goes on with the redo

The group cannot plan ahead -- its membership and the ranks' rates may change at every step
-- so the sampler hands out one step at a time: a DataLoader with worker processes, which
asks for batches ahead of the loop, is refused at its second batch (RuntimeError).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Sized, Union

from .sampler import ThroughputSampler

# Options of a plain ThroughputSampler that an elastic one takes from its group instead.
_GROUP_OPTIONS = ("num_replicas", "rank", "shuffle", "seed", "drop_last", "micro_batch",
                  "min_micro_batches", "policy")


class ElasticThroughputSampler(ThroughputSampler):
    """A ThroughputSampler whose steps come from an ``ElasticGroup`` (see the module)."""

    def __init__(
        self,
        dataset: Union[Sized, int],
        global_batch_size: Optional[int] = None,
        *,
        group: Any,
        state: Optional[Dict[str, Any]] = None,
        **options: Any,
    ) -> None:
        # Sampler.__init__ only stores (or warns about) a data_source; nothing to inherit.
        size = dataset if isinstance(dataset, int) else len(dataset)
        if size != group.dataset_size:
            raise ValueError(
                f"ThroughputSampler: the dataset has {size} samples but the ElasticGroup "
                f"dispatches {group.dataset_size}"
            )
        if global_batch_size is not None and global_batch_size != group.global_batch_size:
            raise ValueError(
                f"ThroughputSampler: global_batch_size {global_batch_size} differs from the "
                f"ElasticGroup's {group.global_batch_size}"
            )
        unknown = sorted(set(options) - set(_GROUP_OPTIONS))
        if unknown:
            raise TypeError(f"ThroughputSampler: unexpected argument(s) {', '.join(unknown)}")
        if options:
            raise ValueError(
                f"ThroughputSampler: {', '.join(sorted(options))} come(s) from the "
                "ElasticGroup over an elastic group; set them there"
            )
        self.elastic_group = group
        self.state: Dict[str, Any] = {} if state is None else state
        self.dataset_len = size
        self.global_batch_size = group.global_batch_size
        self._steps = -(-size // self.global_batch_size)  # ceil
        # (committed steps, membership changes) when the last step was handed out and is not
        # yet reported; None when none is open.
        self._open: Optional[tuple] = None
        self._indices: List[int] = []
        self._grads_ready_at: Optional[float] = None

    # -- DistributedSampler's interface --------------------------------------------------

    @property
    def group(self):
        """The group's current process group (a new one after every membership change)."""
        return self.elastic_group.process_group

    @property
    def num_replicas(self) -> int:
        return self.elastic_group.size

    @property
    def rank(self) -> int:
        return self.elastic_group.rank

    @property
    def epoch(self) -> int:
        return self.elastic_group.epoch

    def __len__(self) -> int:
        """Steps in a whole epoch (an iteration that resumes an epoch yields fewer)."""
        return self._steps

    def set_epoch(self, epoch: int) -> None:
        """The group counts epochs (a joiner takes over the members' count), so this only
        checks that ``epoch`` is not behind it."""
        if epoch < self.elastic_group.epochs_completed:
            raise ValueError(
                f"ThroughputSampler.set_epoch({epoch}): the elastic group has completed "
                f"{self.elastic_group.epochs_completed} epoch(s)"
            )

    def __iter__(self) -> Iterator[List[int]]:
        """The steps up to the end of the group's current epoch (of the next one when the
        current one is done)."""
        group = self.elastic_group
        began = False
        while not (began and group.epoch_done):
            self._check_reported()
            group.sync(self.state)
            self._indices = group.next_step()
            self._open = (group.committed_steps, len(group.changes))
            began = True
            yield self._indices

    def _check_reported(self) -> None:
        if self._open is None:
            return
        group = self.elastic_group
        if (group.committed_steps, len(group.changes)) != self._open:
            self._open = None  # committed since, or a recover() re-planned it
            return
        raise RuntimeError(
            f"ThroughputSampler: the next step was asked for before step {group.step} was "
            "reported (sampler.report()) or recovered (group.recover()). Over an "
            "ElasticGroup the sampler plans one step at a time -- membership and rates may "
            "change at every step -- so use a DataLoader without worker processes "
            "(num_workers=0), and report every step"
        )

    # -- the current step ---------------------------------------------------------------

    @property
    def step(self) -> int:
        return self.elastic_group.step

    @property
    def indices(self) -> List[int]:
        """The dataset indices of this rank's current batch (one padding index when
        ``local_samples`` is 0)."""
        return list(self._indices)

    @property
    def shares(self) -> List[int]:
        """Samples per dispatcher rank (``elastic_group.dispatcher_launch_ranks`` names them;
        ranks that left hold 0)."""
        return self.elastic_group.shares

    @property
    def local_samples(self) -> int:
        return self.elastic_group.local_samples

    @property
    def global_samples(self) -> int:
        return self.elastic_group.global_samples

    @property
    def padded(self) -> bool:
        return self._open is not None and self.elastic_group.local_samples == 0

    @property
    def reported_seconds(self) -> List[float]:
        return []

    def report(self, seconds: Optional[float] = None) -> None:
        """Commits the current step (``ElasticGroup.commit``): this rank's compute time, or
        None when not measured. Call it after the optimizer step."""
        if self._open is None:
            raise RuntimeError("ThroughputSampler.report: no step to report (iterate first)")
        self.elastic_group.commit(seconds)
        self._open = None

    def __repr__(self) -> str:
        g = self.elastic_group
        return (
            f"ThroughputSampler(len={self.dataset_len}, global_batch_size="
            f"{self.global_batch_size}, elastic, rank={g.rank}/{g.size}, epoch={g.epoch})"
        )
