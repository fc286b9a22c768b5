"""How many samples a rank's memory holds in one step: the ThroughputSampler's memory cap.

Memory per sample is measured from the steps themselves -- on a GPU the peak of
``torch.cuda.max_memory_allocated`` over the step above what was allocated before it, on the
CPU the peak resident memory (``VmHWM``, reset through ``/proc/self/clear_refs``) above the
resident memory before it -- and the largest seen is kept (the first steps set it; a
proportional share that grows later is judged by it). The cap is what fits in the memory the
rank may use (its GPU's, or its cgroup's limit / ``RAILSHARD_MEMORY_LIMIT`` / the RAM as the
load signals report it) above what it holds between steps, with 10 % kept free. An
out-of-memory error raises the estimate so that the failed share would not fit again.
"""

from __future__ import annotations

from typing import Optional

import torch

# Kept free of the memory a rank may use: allocator fragmentation, the gradient all-reduce's
# buffers, the next batch being loaded.
HEADROOM = 0.10
# After an out-of-memory error the failed share must not come back: the next cap is at most
# this fraction of it.
AFTER_OOM = 0.75


def _vm_kib(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class MemoryModel:
    """Bytes per sample of one rank, and the samples its memory holds."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bytes_per_sample = 0.0  # the largest measured; 0 until a step is measured
        self._baseline: Optional[float] = None  # held between steps, at the last step's end
        self.highest_peak = 0.0  # the most memory any step took (bytes)
        self._measurable = True

    def _held(self) -> Optional[float]:
        if self.device.type == "cuda":
            return float(torch.cuda.memory_allocated(self.device))
        rss = _vm_kib("VmRSS")
        return None if rss is None else rss * 1024.0

    def _peak(self) -> Optional[float]:
        if self.device.type == "cuda":
            return float(torch.cuda.max_memory_allocated(self.device))
        hwm = _vm_kib("VmHWM")
        return None if hwm is None else hwm * 1024.0

    def _reset_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")  # resets VmHWM to the current RSS
        except OSError:
            self._measurable = False  # peaks cannot be told apart: no cap from here

    def first_step_starts(self) -> None:
        """Before the first step: what is held now is its baseline, its peak counts from here."""
        if self._baseline is None:
            self._baseline = self._held()
            self._reset_peak()

    def step_ended(self, samples: int) -> None:
        """After a step of `samples`: measure its peak, then start the next interval."""
        peak, held = self._peak(), self._held()
        if peak is not None:
            self.highest_peak = max(self.highest_peak, peak)
        if (self._measurable and samples > 0 and peak is not None and held is not None
                and self._baseline is not None and peak > self._baseline):
            self.bytes_per_sample = max(self.bytes_per_sample, (peak - self._baseline) / samples)
        self._baseline = held
        self._reset_peak()

    def out_of_memory(self, samples: int, limit_bytes: float) -> None:
        """A step of `samples` did not fit: raise the estimate so that it will not again."""
        held = self._baseline if self._baseline is not None else self._held() or 0.0
        room = max(limit_bytes * (1 - HEADROOM) - held, 1.0)
        if samples > 0:
            self.bytes_per_sample = max(self.bytes_per_sample, room / (samples * AFTER_OOM))

    def cap(self, limit_bytes: float) -> int:
        """Samples that fit in one step under `limit_bytes` (0: no cap known yet)."""
        if self.bytes_per_sample <= 0 or limit_bytes <= 0 or self._baseline is None:
            return 0
        room = limit_bytes * (1 - HEADROOM) - self._baseline
        # 0 would mean "no cap" to the dispatcher: a rank that holds nothing more still gets one.
        return max(int(room / self.bytes_per_sample), 1)


def is_out_of_memory(error: BaseException) -> bool:
    """True for an allocation that failed: ``torch.OutOfMemoryError`` (CUDA) or the CPU
    allocator's RuntimeError ("DefaultCPUAllocator: can't allocate memory" / "not enough
    memory")."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(
        torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(error, oom_type):
        return True
    text = str(error)
    return isinstance(error, MemoryError) or (isinstance(error, RuntimeError) and (
        "not enough memory" in text or "can't allocate memory" in text
        or "out of memory" in text))
