"""Train a population of checkpoints for meta-network experiments (until model zoos are on main).

    python experiments/metanet_population.py --arch mlp --members 160 --out /tmp/pop-mlp

Architectures: ``mlp`` (MLP 40-32-32-10 on mnist1d), ``transformer``
(TinyTransformer on mnist1d as 10 patches of 4, dim 16, 2 heads, 1 block).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from wsym.metanet.population import save_population, train_population
from wsym.models.networks import MLP, TinyTransformer


class Patches(nn.Module):
    """mnist1d signals ``(B, 40)`` as 10 patches of 4 for a TinyTransformer."""

    def __init__(self):
        super().__init__()
        self.net = TinyTransformer(patch=4, seq=10, dim=16, heads=2, depth=1, hidden=32)

    def forward(self, x):
        """Logits for signals ``(B, 40)``."""
        return self.net(x.reshape(x.shape[0], 10, 4))


ARCHS = {"mlp": lambda: MLP(40, [32, 32], 10), "transformer": Patches}


def main() -> None:
    """Train and save one population."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", choices=sorted(ARCHS), default="mlp")
    parser.add_argument("--members", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    pop = train_population(
        ARCHS[args.arch], "mnist1d", args.members, seed=args.seed, epochs=(5, 25)
    )
    save_population(pop, args.out)
    gaps = torch.tensor([r["gap"] for r in pop.table])
    print(
        f"{args.members} members in {time.perf_counter() - start:.0f}s; "
        f"gap mean {gaps.mean():.3f} std {gaps.std():.3f}"
    )


if __name__ == "__main__":
    main()
