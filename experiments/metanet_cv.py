"""Cross-validated comparison of predictors on a zoo's train + val members (small test splits).

    python experiments/metanet_cv.py --zoo data/zoos/mnist1d-cnn --folds 5

A zoo of 200 members has a 21-member test split: Kendall tau on it has a
standard error near 0.15, so one split cannot separate predictors that differ
by 0.1. This script pools the train and val members (the test split stays
untouched), cuts them into ``--folds`` seeded folds, and for each fold fits every
predictor on the other folds (every 8th of them validates, for early stopping)
and scores it on the fold. It prints the mean Kendall tau over folds with its
standard error (std / sqrt(folds)), one seed per fold.
"""

from __future__ import annotations

import argparse
import math

import torch

from wsym.metanet.evaluate import evaluate, zoo_splits
from wsym.zoo import load


class FoldView:
    """A zoo whose train/val/test splits are one cross-validation fold."""

    def __init__(self, zoo, splits: dict[str, list[int]]):
        self.zoo, self.splits = zoo, splits

    def split(self, name: str) -> list[int]:  # noqa: D102
        return self.splits[name]

    def __getattr__(self, name):
        return getattr(self.zoo, name)


def fold_splits(zoo, folds: int, seed: int = 0) -> list[dict[str, list[int]]]:
    """Per fold: ``{"train", "val", "test"}`` member ids from the zoo's train + val members."""
    ids = zoo_splits(zoo)
    pool = torch.tensor(ids["train"] + ids["val"])
    pool = pool[torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))].tolist()
    out = []
    for k in range(folds):
        held = pool[k::folds]
        rest = [i for i in pool if i not in set(held)]
        val = rest[::8]
        out.append({"train": [i for i in rest if i not in set(val)], "val": val, "test": held})
    return out


def main() -> None:  # noqa: D103
    parser = argparse.ArgumentParser()
    parser.add_argument("--zoo", required=True)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--predictors", default="metanet,statnn,statnn-canonical")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--patience", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    zoo = load(args.zoo)
    names = tuple(args.predictors.split(","))
    taus: dict[str, list[float]] = {n: [] for n in names}
    for k, splits in enumerate(fold_splits(zoo, args.folds)):
        report = evaluate(
            FoldView(zoo, splits),
            predictors=names,
            seeds=(k,),
            metanet_options={"epochs": args.epochs, "patience": args.patience, "hidden": 16},
        )
        for row in report["rows"]:
            if row["status"] == "ok":
                taus[row["name"]].append(row["tau_mean"])
        print(f"fold {k}: " + ", ".join(f"{n} {t[-1]:.3f}" for n, t in taus.items() if t))
    members = {s: len(v) for s, v in fold_splits(zoo, args.folds)[0].items()}
    print(f"{args.zoo}: {args.folds} folds of the train + val members (fold 0: {members})")
    print("| predictor | Kendall tau (mean over folds ± s.e.) |")
    print("|---|---|")
    for n, t in taus.items():
        if t:
            v = torch.tensor(t)
            se = float(v.std()) / math.sqrt(len(t)) if len(t) > 1 else 0.0
            print(f"| {n} | {float(v.mean()):.3f} ± {se:.3f} |")


if __name__ == "__main__":
    main()
