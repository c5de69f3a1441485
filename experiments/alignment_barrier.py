"""Which training setting lets weight matching connect two wide MLPs on mnist1d?

Run from the repository root::

    .venv/bin/python experiments/alignment_barrier.py [--settings NAME ...] [--width 512]

For each setting it trains two ``MLP(40, hidden, 10)`` from seeds 0 and 1
(different initialization and data order), aligns model B onto model A with
``wsym.align(..., method="weights")`` and reports the loss barrier (largest
excess of the loss over the straight line between the endpoint losses, 11
points) on the train and the test split, naive and aligned, with the ratio
aligned / naive and the endpoint accuracies. Every method sees the same pair.

Settings (SGD, lr 0.05, momentum 0.9, batch 128 unless stated):

* ``base``: mnist1d (4000 train), two hidden layers, 30 epochs (the benchmark's
  old setting; the pair memorizes the training set);
* ``wd``: as base with weight decay 5e-4;
* ``base-3``: as base with three hidden layers;
* ``large``: mnist1d-large (20000 train), two hidden layers, 30 epochs;
* ``large-3``: mnist1d-large, three hidden layers (Git Re-Basin's MNIST MLP shape);
* ``large-wd``: mnist1d-large, two hidden layers, weight decay 5e-4.
"""

from __future__ import annotations

import argparse
from time import perf_counter

import torch
from torch.nn import functional as F

import wsym
from wsym.io.datasets import load
from wsym.models.networks import MLP
from wsym.models.train import train

SETTINGS = {
    "base": {"data": "mnist1d", "depth": 2, "epochs": 30, "weight_decay": 0.0},
    "wd": {"data": "mnist1d", "depth": 2, "epochs": 30, "weight_decay": 5e-4},
    "base-3": {"data": "mnist1d", "depth": 3, "epochs": 30, "weight_decay": 0.0},
    "large": {"data": "mnist1d-large", "depth": 2, "epochs": 30, "weight_decay": 0.0},
    "large-3": {"data": "mnist1d-large", "depth": 3, "epochs": 30, "weight_decay": 0.0},
    "large-wd": {"data": "mnist1d-large", "depth": 2, "epochs": 30, "weight_decay": 5e-4},
}


def run(name: str, width: int, epochs: int | None) -> dict:
    """Train the pair of one setting and measure naive and aligned barriers."""
    s = SETTINGS[name]
    data = load(s["data"])
    models, accs = [], []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = MLP(40, [width] * s["depth"], 10)
        r = train(
            model,
            data,
            seed=seed,
            epochs=epochs or s["epochs"],
            lr=0.05,
            optimizer="sgd",
            batch_size=128,
            weight_decay=s["weight_decay"],
        )
        models.append(model.eval())
        accs.append((r["train_accuracy"], r["test_accuracy"]))
    sd_a, sd_b = ({k: v.detach().clone() for k, v in m.state_dict().items()} for m in models)
    spec = wsym.detect(models[0], data.x_train[:64])
    aligned = wsym.align(sd_a, sd_b, spec, "weights")
    out = {"name": name, "accuracies": accs}
    for split in ("train", "test"):
        batches = list(data.batches(split, 1000))
        for method, sd in (("naive", sd_b), ("weights", aligned)):
            curve = wsym.interpolate(models[0], sd_a, sd, batches, F.cross_entropy, 11)
            out[f"{method}/{split}"] = curve.barrier
    return out


def main() -> None:
    """Train and measure the chosen settings, one line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=None, help="override every setting's")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("setting   acc A train/test  acc B train/test  naive train/test  weights train/test")
    for name in args.settings:
        start = perf_counter()
        r = run(name, args.width, args.epochs)
        (a_tr, a_te), (b_tr, b_te) = r["accuracies"]
        nt, ne = r["naive/train"], r["naive/test"]
        wt, we = r["weights/train"], r["weights/test"]
        print(
            f"{name:<9} {a_tr:.3f} / {a_te:.3f}     {b_tr:.3f} / {b_te:.3f}     "
            f"{nt:.3f} / {ne:.3f}     {wt:.3f} / {we:.3f}  "
            f"(x naive {wt / nt:.2f} / {we / ne:.2f})  {perf_counter() - start:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
