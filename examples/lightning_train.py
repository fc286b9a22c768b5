"""PyTorch Lightning with railshard: Lightning's own DDPStrategy, backend "railshard", nothing
else changed. Run under torchrun (or railshard-launch, mpirun), one process per device:

    torchrun --nproc-per-node 3 examples/lightning_train.py --backend railshard
    python examples/lightning_train.py --devices 3   # Lightning starts the processes itself

A small regression model on a fixed synthetic dataset (the same on every run), trained for
--epochs; rank 0 prints the final loss and, with --save FILE, writes the final parameters
(tests/python/test_lightning.py compares them with a gloo run's).
"""

import argparse
import os

import torch
from torch.utils.data import DataLoader, TensorDataset

import railshard  # noqa: F401  (registers the backend "railshard")

try:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy
except ImportError:  # the standalone package (pip install pytorch-lightning)
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import DDPStrategy


class Regressor(pl.LightningModule):
    def __init__(self, lr):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                       torch.nn.Linear(32, 1))
        self.lr = lr

    def training_step(self, batch, _index):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def make_model_and_data():
    """The same data and the same initial model on every rank and every run."""
    torch.manual_seed(0)
    x = torch.randn(480, 16)
    y = x @ torch.randn(16, 1) + 0.1 * torch.randn(480, 1)
    return Regressor(lr=0.05), DataLoader(TensorDataset(x, y), batch_size=16)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="railshard")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--devices", type=int,
                        default=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                        help="processes on this host (default: torchrun's LOCAL_WORLD_SIZE, or 1)")
    parser.add_argument("--save", help="rank 0 writes the final state_dict here")
    args = parser.parse_args()

    model, loader = make_model_and_data()

    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, num_nodes=1,
                         strategy=DDPStrategy(process_group_backend=args.backend),
                         max_epochs=args.epochs, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         deterministic=True)
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        print(f"lightning_train.py: backend {args.backend}, {trainer.world_size} ranks, "
              f"final loss {trainer.callback_metrics['loss'].item():.6f}", flush=True)
        if args.save:
            torch.save(model.state_dict(), args.save)


if __name__ == "__main__":
    main()
