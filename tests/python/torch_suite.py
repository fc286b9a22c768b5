"""Runs PyTorch's own generic distributed test base against a backend, the way torch's
test/distributed/test_distributed_spawn.py does (each test spawns WORLD_SIZE processes that
rendezvous over file://).

    BACKEND=railshard WORLD_SIZE=2 python torch_suite.py [unittest arguments, e.g. -k send]

The railshard package is imported first, so the spawned ranks (which import this module)
have the backend registered, and railshard is declared a backend with DDP and sub-group
support (the base's own feature sets, which name gloo, nccl and ucc). With
RAILSHARD_SUITE_JSON=<file> each test's outcome is written there as JSON. TEMP_DIR is made when not given. Used by test_torch_suite.py,
which runs a selection under both gloo and railshard and compares.
"""

import functools
import os
import socket
import sys
import tempfile

os.environ.setdefault("BACKEND", "railshard")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="rs-torch-suite-"))
# test_barrier_timeout_global re-initialises the group through INIT_METHOD with a 1 s timeout.
# torch gates it to file:// because over env:// the second TCP store's connect races that
# second (it lost under CI's load: "The client socket has timed out after 1s"); a file per run,
# as torch's run_test.py gives its file:// configuration. Read when the base is imported.
os.environ.setdefault("INIT_METHOD", f"file://{os.environ['TEMP_DIR']}/init_method")

if os.environ["BACKEND"] == "railshard":
    import railshard  # noqa: F401  (registers the backend)

import torch  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402
from torch.testing._internal.common_utils import run_tests  # noqa: E402

# The base decides at import which tests a backend gets, from these sets of backend names
# (gloo is in both). railshard supports DDP and sub-groups on the CPU; declared before the
# test base is imported, so its decorators see it. Nothing else about the tests changes.
if os.environ["BACKEND"] == "railshard":
    DistTestCases.backend_feature["ddp"].add("railshard")
    DistTestCases.backend_feature["subgroup"].add("railshard")
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

torch.backends.cuda.matmul.allow_tf32 = False


# How each test starts its ranks. spawn (torch's own test_distributed_spawn.py): every rank is
# a fresh interpreter that imports torch and this module again, 1-3 s per rank and test, most
# of the suite's time. fork (the default here, as torch's test_distributed_fork.py did for CPU
# backends up to 1.x): the ranks are copies of this process, torch and railshard already
# imported; the test bodies are the same. RAILSHARD_SUITE_START=spawn runs it torch's way.
START = os.environ.get("RAILSHARD_SUITE_START", "fork")
if START not in ("fork", "spawn"):
    sys.exit(f"torch_suite.py: RAILSHARD_SUITE_START must be fork or spawn, not {START!r}")


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if START == "spawn":
            self._spawn_processes()
        else:
            # A test that re-initialises over env:// (INIT_METHOD=env:// given by hand) needs a
            # port all ranks agree on: a free one per test, inherited by the forked ranks.
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


# Tests the base skips for any backend not named gloo (or mpi, nccl) although they only use
# what railshard implements: get_future, coalesced all-reduce, object collectives, monitored
# barrier, per-call barrier timeouts, CPU batch_isend_irecv, sparse all-reduce. They run
# unchanged; only the name check in their decorators is lifted. Left out: the four
# test_accumulate_gradients_no_sync* (their bodies build the model only when the backend is
# named gloo, mpi or nccl).
NAME_GATED = [
    "test_all_gather_object_default_pg",
    "test_all_gather_object_subgroup", "test_all_reduce_coalesced_full_group_max",
    "test_all_reduce_coalesced_full_group_min", "test_all_reduce_coalesced_full_group_product",
    "test_all_reduce_coalesced_full_group_sum", "test_all_reduce_coalesced_max",
    "test_all_reduce_coalesced_min", "test_all_reduce_coalesced_product",
    "test_all_reduce_coalesced_sum", "test_all_reduce_coalesced_group_max",
    "test_all_reduce_coalesced_group_min", "test_all_reduce_coalesced_group_product",
    "test_all_reduce_coalesced_group_sum", "test_barrier_timeout_full_group",
    "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags", "test_get_future",
    "test_grads_same_across_ranks_with_no_sync", "test_monitored_barrier_gloo",
    "test_monitored_barrier_gloo_rank_0_timeout", "test_monitored_barrier_gloo_subgroup",
    "test_scatter_object_list", "test_sparse_all_reduce_sum",
    # Skipped for gloo too ("Only MPI supports [CPU] all_to_all[_single]"); railshard has them.
    "test_all_to_all", "test_all_to_all_complex", "test_all_to_all_full_group",
    "test_all_to_all_group", "test_all_to_all_single_equal_split",
    "test_all_to_all_single_equal_split_complex", "test_all_to_all_single_equal_split_full_group",
    "test_all_to_all_single_equal_split_group", "test_all_to_all_single_unequal_split",
    "test_all_to_all_single_unequal_split_complex",
    "test_all_to_all_single_unequal_split_full_group", "test_all_to_all_single_unequal_split_group",
    "test_barrier_timeout_global", "test_barrier_timeout_group",
]


def _unskipped(fn):
    @functools.wraps(fn)
    def run(self, *args, **kwargs):
        return fn(self, *args, **kwargs)

    run.__dict__.pop("__unittest_skip__", None)
    run.__dict__.pop("__unittest_skip_why__", None)
    return run


# torch 1.13 only: object collectives the 1.13 base gates behind its "gpu" backend set (they
# use CPU tensors unless the backend is nccl; 2.x gates them by world size and known bugs
# instead, which must stay). Left gated on 1.13: the monitored-barrier tests, since 1.13's own
# dist.monitored_barrier refuses every backend but gloo before a backend sees the call.
NAME_GATED_1_13 = ["test_broadcast_object_list", "test_gather_object",
                   "test_gather_object_subgroup"]
_TORCH_1 = int(torch.__version__.split(".")[0]) < 2
if _TORCH_1:
    NAME_GATED = [n for n in NAME_GATED if "monitored_barrier" not in n] + NAME_GATED_1_13

if os.environ["BACKEND"] == "railshard":
    for _name in NAME_GATED:
        # Older bases (torch 1.13) lack some of them.
        if hasattr(DistributedTest._DistTestBase, _name):
            setattr(TestDistBackendWithSpawn, _name,
                    _unskipped(getattr(DistributedTest._DistTestBase, _name)))


def _run_recording(path):
    """Runs the tests named on the command line (unittest syntax) and writes
    {test name: "pass" | "fail" | "error" | "skip: reason"} to `path` as JSON."""
    import json
    import unittest

    outcomes = {}

    class Recording(unittest.TextTestResult):
        def addSuccess(self, test):
            super().addSuccess(test)
            outcomes[test._testMethodName] = "pass"

        def addFailure(self, test, err):
            super().addFailure(test, err)
            outcomes[test._testMethodName] = "fail: " + self._exc_info_to_string(err, test)[-2000:]

        def addError(self, test, err):
            super().addError(test, err)
            outcomes[test._testMethodName] = "error: " + self._exc_info_to_string(err, test)[-2000:]

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            outcomes[test._testMethodName] = "skip: " + str(reason)

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            outcomes[test._testMethodName] = "pass"

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            outcomes[test._testMethodName] = "fail: unexpected success"

    runner = unittest.TextTestRunner(resultclass=Recording, verbosity=1)
    unittest.main(module="__main__", argv=[sys.argv[0]] + sys.argv[1:], testRunner=runner,
                  exit=False)
    with open(path, "w") as f:
        json.dump(outcomes, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    if os.environ.get("RAILSHARD_SUITE_JSON"):
        _run_recording(os.environ["RAILSHARD_SUITE_JSON"])
    else:
        run_tests()
