"""PyTorch Lightning, unchanged, on railshard: examples/lightning_train.py trains with
Lightning's own DDPStrategy(process_group_backend=...) under torchrun, once with gloo (the
reference) and once with railshard, at 2 and 3 ranks; the final parameters must agree."""

import importlib.util
import subprocess
import sys

import pytest

from conftest import REPO, UNDER_TEST_IS_RAILSHARD, free_port, launch_env

try:
    import lightning.pytorch  # noqa: F401
    HAVE_LIGHTNING = True
except ImportError:
    try:
        import pytorch_lightning  # noqa: F401
        HAVE_LIGHTNING = True
    except ImportError:
        HAVE_LIGHTNING = False

EXAMPLE = REPO / "examples" / "lightning_train.py"

pytestmark = [
    pytest.mark.skipif(not HAVE_LIGHTNING, reason="PyTorch Lightning is not installed "
                       "(scripts/torch_venv.sh installs pytorch-lightning in the torch 2.x venv)"),
    pytest.mark.skipif(not UNDER_TEST_IS_RAILSHARD, reason="compares railshard with gloo"),
]


def _train(backend, ranks, tmp_path):
    out = tmp_path / f"{backend}_{ranks}.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           str(EXAMPLE), "--backend", backend, "--epochs", "2",
           "--save", str(out)]
    proc = subprocess.run(cmd, env=launch_env({"RAILSHARD_TIMEOUT": "60"}), capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert f"backend {backend}, {ranks} ranks, final loss" in text, text
    import torch

    return torch.load(out)


@pytest.mark.parametrize("ranks", [2, 3])
def test_lightning_ddp_on_railshard_ends_where_gloo_does(ranks, tmp_path):
    import torch

    reference = _train("gloo", ranks, tmp_path)
    ours = _train("railshard", ranks, tmp_path)
    assert reference.keys() == ours.keys()
    for name in reference:
        # The same gradients averaged in possibly another order: equal to float rounding.
        torch.testing.assert_close(ours[name], reference[name], rtol=1e-5, atol=1e-6,
                                   msg=lambda m, n=name: f"{n}: {m}")
    # Trained at all: every parameter moved away from the example's initial model.
    spec = importlib.util.spec_from_file_location("lightning_train", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    initial = example.make_model_and_data()[0].state_dict()
    for name in initial:
        assert not torch.allclose(ours[name], initial[name]), f"{name} did not change"
