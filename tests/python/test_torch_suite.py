"""PyTorch's own distributed test base as the judge (torch_suite.py).

Runs a selection of torch's DistributedTest._DistTestBase against the railshard backend,
WORLD_SIZE=2, and requires every selected test that gloo passes here
(torch_suite_gloo_passes.txt, recorded from a gloo run of the whole base) to pass, and no
selected test to fail. The selection is bounded for CI (each test spawns its ranks afresh,
~2-6 s): point-to-point, all-to-all, coalesced collectives, timeouts, monitored barrier,
futures, object collectives, sub-groups and DDP's logging (the plain collectives are
covered by test_collectives.py against gloo). RAILSHARD_TORCH_SUITE=all runs the whole base
instead (~15 minutes here); docs/pytorch.md has the figures of a whole run.

torch 2.x only: the base needs expecttest (scripts/torch_venv.sh installs it); with torch
1.13 (Debian, no expecttest package) the test skips, saying so.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import conftest  # noqa: E402

HERE = Path(__file__).resolve().parent
SELECTION = [
    "test_send_recv", "test_isend", "test_irecv", "test_batch_isend_irecv_gloo",
    "test_all_to_all", "test_all_gather_coalesced", "test_barrier_timeout",
    "test_ddp_logging_data_cpu", "test_monitored_barrier", "test_get_future",
    "test_all_reduce_coalesced_sum", "test_all_gather_object", "test_scatter_object_list",
    "test_barrier_full_group", "test_new_subgroups",
]
# gloo passes these and railshard cannot run them, each for its reason (docs/pytorch.md).
KNOWN_GAPS = {
    "test_sparse_all_reduce_sum": "railshard has no sparse all-reduce",
    "test_accumulate_gradients_no_sync": "the body builds its model only for gloo/mpi/nccl",
    "test_accumulate_gradients_no_sync_allreduce_hook": "same",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook": "same",
    "test_accumulate_gradients_no_sync_grad_is_view": "same",
}


def _gloo_passes():
    lines = (HERE / "torch_suite_gloo_passes.txt").read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


@pytest.mark.railshard_only
def test_torch_distributed_test_base():
    conftest.skip_unless_railshard()
    if int(torch.__version__.split(".")[0]) < 2:
        pytest.skip("torch's test base is run with torch 2.x (1.13's needs expecttest, which "
                    "Debian does not package)")
    try:
        import expecttest  # noqa: F401
    except ImportError:
        pytest.skip("expecttest is not installed (scripts/torch_venv.sh installs it)")
    out = Path(tempfile.mkdtemp(prefix="rs-torch-suite-")) / "outcomes.json"
    env = conftest.child_env({"BACKEND": "railshard", "WORLD_SIZE": "2",
                              "RAILSHARD_SUITE_JSON": str(out), "TEMP_DIR": str(out.parent),
                              "PYTORCH_PRINT_REPRO_ON_FAILURE": "0"})
    args = [sys.executable, "torch_suite.py"]
    if os.environ.get("RAILSHARD_TORCH_SUITE") != "all":
        for name in SELECTION:
            args += ["-k", name]
    run = subprocess.run(args, cwd=HERE, env=env, capture_output=True, text=True, timeout=2400)
    assert out.exists(), f"the suite wrote no outcomes (exit {run.returncode}):\n" \
                         f"{run.stderr[-5000:]}"
    outcomes = json.loads(out.read_text())
    gloo = _gloo_passes()
    failed = {k: v for k, v in outcomes.items() if not v.startswith(("pass", "skip"))}
    missed = {k: v for k, v in outcomes.items()
              if k in gloo and v != "pass" and k not in KNOWN_GAPS}
    passed = sum(v == "pass" for v in outcomes.values())
    print(f"torch suite: {len(outcomes)} run, {passed} passed, "
          f"{sum(v.startswith('skip') for v in outcomes.values())} skipped")
    assert not failed, "\n\n".join(f"{k}: {v}" for k, v in sorted(failed.items()))
    assert not missed, "gloo passes these, railshard did not:\n" + "\n".join(
        f"{k}: {v[:300]}" for k, v in sorted(missed.items()))
    assert passed >= 25 or os.environ.get("RAILSHARD_TORCH_SUITE") == "all", outcomes
