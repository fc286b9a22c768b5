"""What a ThroughputSampler rank says about itself each step besides its seconds: the load
signals (``railshard._C.LoadMonitor``: memory and its limit, CPU quota and throttling, GPU
utilisation and memory, power and energy), the caller's queue length, and the memory cap
(``memory.MemoryModel``). Packed as a row of floats for the sampler's all-gather."""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

from .memory import MemoryModel


def _names() -> List[str]:
    from . import _C

    return list(_C.LOAD_SIGNALS)


class RankSignals:
    """One rank's side: read once per report()."""

    def __init__(self, device: torch.device) -> None:
        from . import _C

        gpu = device.index if device.type == "cuda" and device.index is not None else (
            torch.cuda.current_device() if device.type == "cuda" else -1)
        self.monitor = _C.LoadMonitor(gpu)
        self.memory = MemoryModel(device)
        self.names = _names()
        self._oom_cap: Optional[int] = None  # set by an out-of-memory error, until measured
        self.last_cap = 0  # the cap this rank reported last (samples; 0: none)
        self.last_limit = 0.0  # the memory it may use, as reported last (bytes)

    def row(self, samples: int, queued_samples: Optional[float]) -> List[float]:
        """[energy_joules, *signals in LOAD_SIGNALS order] after a step of `samples`."""
        signals, energy = self.monitor.sample()
        self.memory.step_ended(samples)
        limit = signals["gpu_memory_total_bytes"] if self.memory.device.type == "cuda" else (
            signals["memory_limit_bytes"])
        cap = self.memory.cap(limit)
        if self._oom_cap is not None:
            cap = min(cap, self._oom_cap) if cap > 0 else self._oom_cap
        signals["cap_samples"] = float(cap)
        self.last_cap, self.last_limit = cap, float(limit)
        if queued_samples is not None:
            signals["queued_samples"] = float(queued_samples)
        return [float(energy)] + [float(signals[name]) for name in self.names]

    def out_of_memory(self, samples: int) -> None:
        """The step of `samples` raised out-of-memory: cap below it from now on."""
        signals, _ = self.monitor.sample()
        limit = signals["gpu_memory_total_bytes"] if self.memory.device.type == "cuda" else (
            signals["memory_limit_bytes"])
        self.memory.out_of_memory(samples, limit)
        cap = max(int(samples * 0.75), 1)
        self._oom_cap = cap if self._oom_cap is None else min(self._oom_cap, cap)
