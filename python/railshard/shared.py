"""Host tensors the other ranks of a host read in place.

A one-host all-reduce of at least ``RAILSHARD_SHM_SINGLE_COPY`` bytes reads the other ranks'
buffers directly instead of staging every byte through shared memory. An ordinary tensor is
staged (or, with ``RAILSHARD_SHM_CROSS_READ=1``, read with ``process_vm_readv``, which pins
its pages on every call and is slower than staging on some CPUs); a tensor from
``empty_shared`` lives in a memory region each peer maps once and then reads with plain loads
-- as NCCL's user buffer registration does. Allocate long-lived buffers this way (a flat
gradient buffer whose views are the gradients, a communication bucket) and reuse them; the
memory is freed with the tensor.
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
