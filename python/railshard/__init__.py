"""railshard for PyTorch: the ``torch.distributed`` backend ``"railshard"``, a
throughput-aware batch sampler and the gradient weighting that goes with it.

    import railshard  # registers the backend
    import torch.distributed as dist
    dist.init_process_group("railshard")

See docs/pytorch.md.
"""

import atexit
import os

import torch
import torch.distributed as dist

from . import _build_info


def _check_torch_matches():
    # The extension is tied to the torch it was compiled against (C++ ABI, c10d classes);
    # loading it into another one aborts the interpreter or fails in obscure ways, so this
    # runs before _C is imported, from a file CMake wrote.
    built = _build_info.torch_version.split("+")[0]
    running = torch.__version__.split("+")[0]
    if built.split(".")[:2] != running.split(".")[:2]:
        raise ImportError(
            f"railshard was built against torch {built} (for {_build_info.python}) but this "
            f"interpreter runs torch {running}; rebuild with -DRAILSHARD_PYTHON=<this python>"
        )


_check_torch_matches()

from . import _C  # noqa: E402
from ._C import (  # noqa: E402,F401  (re-exported)
    ConfigError,
    Dispatcher,
    Error,
    InvalidArgument,
    MismatchError,
    PeerLostError,
    ProtocolError,
    TimeoutError,
)

BACKEND = "railshard"


def _torch_major_minor():
    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def _create(store, rank, world_size, timeout):
    # torch 2.x: a ProcessGroup that names itself "railshard" (DDP's logging asks it), except
    # under TORCH_DISTRIBUTED_DEBUG=DETAIL, whose checking wrapper torch only puts around a
    # bare backend (the group then reports "custom").
    if hasattr(_C, "create_named_group") and dist.get_debug_level() != dist.DebugLevel.DETAIL:
        return _C.create_named_group(store, rank, world_size, timeout,
                                     bool(torch.version.cuda))
    return _C.create_backend(store, rank, world_size, timeout)


def _register():
    if BACKEND.upper() in dir(dist.Backend) or BACKEND in getattr(
        dist.Backend, "backend_list", []
    ):
        return  # imported twice (e.g. reloaded)
    if _torch_major_minor() >= (2, 1):
        # Host staging makes CUDA tensors work too (copied through host memory).
        devices = ["cpu", "cuda"] if torch.version.cuda else ["cpu"]
        dist.Backend.register_backend(BACKEND, _create, devices=devices)
    else:
        dist.Backend.register_backend(BACKEND, _create)


_register()
# Groups still referenced at exit (a DDP model, torch's registry) are closed while Python and
# the C++ runtime are intact; see ProcessGroupRailshard::shutdownAll.
atexit.register(_C._shutdown_all)

from .shared import empty_shared  # noqa: E402,F401
from .sampler import ThroughputSampler  # noqa: E402,F401
from .memory import is_out_of_memory  # noqa: E402,F401
from .hooks import loss_scale, weighted_allreduce_hook  # noqa: E402,F401
from .launch import fill_env, init_process_group  # noqa: E402,F401

__version__ = _build_info.version

# Under mpirun or srun, which set no RANK/WORLD_SIZE, the plain dist.init_process_group("railshard")
# would fail for want of env:// variables: they are filled in here from the launcher's own
# (launch.fill_env). Only when RANK and WORLD_SIZE are both unset: what torchrun or the user
# set is never touched.
if "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
    fill_env()
from .elastic import ElasticDataParallel, ElasticGroup, is_peer_lost  # noqa: E402,F401
