"""A small population of trained checkpoints, for meta-networks without a model zoo.

:func:`train_population` trains copies of one architecture with hyperparameters
drawn from ``seed`` (training-set size, learning rate, weight decay, epochs) and
records the generalization gap of each. The result has the same reading
interface as a :mod:`wsym.zoo` zoo (``table``, ``split``, ``state_dicts``,
``model``, ``example_inputs``), so the meta-network evaluation runs on either.
:func:`save_population` / :func:`load_population` keep it in a directory
(``table.json`` and one ``.safetensors`` per member).

Example:
    >>> from wsym.models.networks import MLP
    >>> pop = train_population(lambda: MLP(64, [8], 10), "digits", 3, epochs=(1, 2), flatten=True)
    >>> [sorted(r)[:3] for r in pop.table][0], len(pop.state_dicts())
    (['batch_size', 'epochs', 'gap'], 3)
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from wsym.errors import WsymInputError
from wsym.io.checkpoint import load_state_dict, save_state_dict
from wsym.io.datasets import Dataset, load
from wsym.models.train import train

SPLITS = ("train", "val", "test")


@dataclass
class Population:
    """Checkpoints of one architecture with their measured accuracies and gaps."""

    factory: object
    table: list[dict]
    sds: list[dict] = field(repr=False)
    inputs: torch.Tensor = field(repr=False)
    data_name: str = ""

    def split(self, name: str) -> list[int]:
        """Member ids of the ``"train"``, ``"val"`` or ``"test"`` split."""
        return [r["id"] for r in self.table if r["split"] == name]

    def state_dicts(self, ids=None) -> list[dict]:
        """State dicts of ``ids`` (all members by default)."""
        return [self.sds[i] for i in (range(len(self.sds)) if ids is None else ids)]

    def state_dict(self, member_id: int) -> dict:
        """One member's state dict."""
        return self.sds[member_id]

    def model(self, member_id: int) -> nn.Module:
        """One member as a module."""
        m = self.factory()
        m.load_state_dict(self.sds[member_id])
        return m

    def example_inputs(self) -> torch.Tensor:
        """Inputs for symmetry detection."""
        return self.inputs

    def dataset(self) -> Dataset:
        """The dataset the members were trained on."""
        return load(self.data_name)


def _subset(data: Dataset, n: int, seed: int) -> Dataset:
    idx = torch.randperm(len(data.x_train), generator=torch.Generator().manual_seed(seed))[:n]
    return Dataset(data.x_train[idx], data.y_train[idx], data.x_test, data.y_test, data.name)


def train_population(
    factory,
    data: str,
    members: int,
    *,
    seed: int = 0,
    epochs=(5, 30),
    train_sizes=(200, 4000),
    lr=(0.01, 0.3),
    flatten: bool = False,
) -> Population:
    """Train ``members`` copies of ``factory()`` on dataset ``data`` with random hyperparameters.

    Splits: 60% train, 20% val, 20% test (by member id order of a seeded shuffle).
    ``flatten`` wraps the model in ``nn.Flatten`` for image datasets (digits).
    """
    full = load(data)
    rng = random.Random(seed)
    table, sds = [], []
    splits = ["train"] * members
    order = list(range(members))
    rng.shuffle(order)
    for k, i in enumerate(order):
        splits[i] = "test" if k < members // 5 else "val" if k < 2 * (members // 5) else "train"
    for i in range(members):
        hp = {
            "train_size": int(math.exp(rng.uniform(*map(math.log, train_sizes)))),
            "lr": math.exp(rng.uniform(*map(math.log, lr))),
            "weight_decay": rng.choice([0.0, 1e-4, 1e-3]),
            "epochs": rng.randint(*epochs),
            "batch_size": rng.choice([32, 64, 128]),
        }
        torch.manual_seed(seed * 100003 + i)
        model = factory()
        run = nn.Sequential(nn.Flatten(), model) if flatten else model
        r = train(
            run,
            _subset(full, hp["train_size"], seed + i),
            epochs=hp["epochs"],
            lr=hp["lr"],
            batch_size=hp["batch_size"],
            weight_decay=hp["weight_decay"],
            seed=i,
        )
        acc = {"train_acc": r["train_accuracy"], "test_acc": r["test_accuracy"]}
        table.append(
            {"id": i, "split": splits[i], **hp, **acc, "gap": acc["train_acc"] - acc["test_acc"]}
        )
        sds.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    x = full.x_train[:4].flatten(1) if flatten else full.x_train[:4]
    return Population(factory, table, sds, x, data)


def save_population(pop: Population, directory: str | Path) -> None:
    """Write ``table.json``, ``inputs.safetensors`` and ``members/<id>.safetensors``."""
    d = Path(directory)
    (d / "members").mkdir(parents=True, exist_ok=True)
    for r, sd in zip(pop.table, pop.sds, strict=True):
        save_state_dict(sd, d / "members" / f"{r['id']}.safetensors")
    save_state_dict({"x": pop.inputs}, d / "inputs.safetensors")
    (d / "table.json").write_text(json.dumps({"data": pop.data_name, "table": pop.table}))


def load_population(directory: str | Path, factory) -> Population:
    """Read a directory written by :func:`save_population`."""
    d = Path(directory)
    if not (d / "table.json").is_file():
        raise WsymInputError(f"{d} has no table.json; write it with save_population")
    meta = json.loads((d / "table.json").read_text())
    sds = [load_state_dict(d / "members" / f"{r['id']}.safetensors") for r in meta["table"]]
    x = load_state_dict(d / "inputs.safetensors")["x"]
    return Population(factory, meta["table"], sds, x, meta["data"])
