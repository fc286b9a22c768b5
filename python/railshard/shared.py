"""Host tensors the other ranks of a host read in place.

A one-host all-reduce of at least ``RAILSHARD_SHM_SINGLE_COPY`` bytes reads the other ranks'
buffers directly instead of staging every byte through shared memory. A tensor in a memory
region each peer maps once is read with plain loads -- as NCCL's user buffer registration
does; any other tensor is staged, or read with ``process_vm_readv`` where a start-up probe
found that faster on this host (``RAILSHARD_SHM_CROSS_READ``).

Nothing needs to change in a training script: once a railshard group runs with several ranks
on this host, CPU tensors of at least ``RAILSHARD_SHARED_ALLOC`` bytes (1 MiB) come from such
regions (torch's CPU allocator is wrapped; smaller tensors are torch's own), so DDP's gradient
buckets, allocated after the group forms, take the mapped path. Freed regions are kept for
reuse, at most as many bytes as were ever live at once; :func:`release_cached` returns them.
A forked child (a DataLoader worker) gets copy-on-write copies of the regions, as of the rest
of its memory. ``RAILSHARD_SHARED_ALLOC=0`` keeps torch's allocator.

``empty_shared`` allocates such a tensor explicitly, whatever the allocator.
"""

from __future__ import annotations

import math

import torch

from . import _C


def empty_shared(*size, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A zero-filled contiguous CPU tensor of ``size`` and ``dtype`` whose memory
    the other ranks of this host can map (see the module's docstring)."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    numel = math.prod(size)
    element = torch.empty((), dtype=dtype).element_size()
    raw = _C._empty_shared_bytes(max(1, numel) * element)
    return raw[: numel * element].view(dtype).view(size)


def is_shared(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s memory lies in a region the other ranks of this host can map."""
    return bool(_C._is_shared(tensor))


def allocator_stats() -> dict:
    """The shared CPU allocator of this process: ``installed``, ``live_bytes`` and
    ``live_regions`` (in use), ``kept_bytes`` and ``kept_regions`` (freed, kept for reuse),
    ``peak_live_bytes``, ``allocations`` and ``reused`` (of them, served from kept regions)."""
    return dict(_C._shared_allocator_stats())


def release_cached() -> None:
    """Returns the regions kept for reuse to the system (as ``torch.cuda.empty_cache()``)."""
    _C._release_shared_cache()
