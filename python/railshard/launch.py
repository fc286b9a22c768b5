"""torch.distributed's env:// variables from whichever launcher started this process.

railshard-launch and torchrun already export RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
mpirun and srun do not: `init_process_group()` below fills them in from OpenMPI's or Slurm's
own variables, so the same script runs under all four.
"""

import os

import torch.distributed as dist

# (rank, world size, local rank) variables of each launcher, in the order railshard's C++
# init() trusts them (docs/configuration.md).
_LAUNCHERS = (
    ("railshard-launch", "RAILSHARD_RANK", "RAILSHARD_WORLD_SIZE", "RAILSHARD_LOCAL_RANK"),
    ("mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)

DEFAULT_MASTER_PORT = "29500"  # torchrun's


def fill_env(environ=None):
    """Sets RANK/WORLD_SIZE/LOCAL_RANK and MASTER_ADDR/MASTER_PORT in `environ` (default
    os.environ) where missing, from the first launcher whose variables are present. Returns
    the launcher's name, or None when nothing but torch's own variables were there.

    MASTER_ADDR defaults to 127.0.0.1: on several hosts, export it (e.g. `mpirun -x
    MASTER_ADDR=node0`, or the first host of `scontrol show hostnames`)."""
    env = os.environ if environ is None else environ
    for name, rank, size, local in _LAUNCHERS:
        if rank in env and size in env:
            env.setdefault("RANK", env[rank])
            env.setdefault("WORLD_SIZE", env[size])
            env.setdefault("LOCAL_RANK", env.get(local, "0"))
            if env["RANK"] != env[rank] or env["WORLD_SIZE"] != env[size]:
                raise RuntimeError(
                    f"contradictory environment: {rank}={env[rank]} {size}={env[size]} but "
                    f"RANK={env['RANK']} WORLD_SIZE={env['WORLD_SIZE']}")
            env.setdefault("MASTER_ADDR", "127.0.0.1")
            env.setdefault("MASTER_PORT", DEFAULT_MASTER_PORT)
            return name
    return None


def init_process_group(backend="railshard", **kwargs):
    """dist.init_process_group(backend, **kwargs) after fill_env(): works unchanged under
    railshard-launch, torchrun, mpirun and srun."""
    if "init_method" not in kwargs and "store" not in kwargs:
        fill_env()
    dist.init_process_group(backend, **kwargs)
