"""Train the shipped park meta-network (``wsym predict`` on every park architecture).

    python experiments/metanet_park_train.py --zoo data/zoos/mnist1d-park \
        --out models/metanet-mnist1d-park.safetensors

Fits :func:`wsym.metanet.park_fit.fit_zoo` (the zoo's train split, val for
early stopping, target ``gap``), stores the specs of every architecture of the
zoo (held-out ones too) and the preset's architecture space (so it reads every
architecture the preset can draw), and writes the ``.safetensors`` file and its model card
(``.md``) with the test Kendall tau on the held-out members and architectures.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from wsym.metanet.park_fit import fit_zoo, park_card
from wsym.zoo import load


def main() -> None:  # noqa: D103
    parser = argparse.ArgumentParser()
    parser.add_argument("--zoo", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--patience", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--trees", type=int, default=0)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--stat-readout", action="store_true")
    parser.add_argument("--paths", action="store_true")
    parser.add_argument("--combine", default="blend")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    p, taus = fit_zoo(
        load(args.zoo),
        seed=args.seed,
        epochs=args.epochs,
        patience=args.patience,
        hidden=args.hidden,
        trees=args.trees,
        lr=args.lr,
        stat_readout=args.stat_readout,
        paths=args.paths,
        combine=args.combine,
        batch_size=args.batch_size,
    )
    out = Path(args.out)
    p.save(out)
    command = (
        f"python experiments/metanet_park_train.py --zoo {args.zoo} --out {args.out} "
        f"--seed {args.seed} --epochs {args.epochs} --patience {args.patience} "
        f"--hidden {args.hidden} --trees {args.trees} --lr {args.lr} --combine {args.combine} "
        f"--batch-size {args.batch_size}"
        + (" --stat-readout" if args.stat_readout else "")
        + (" --paths" if args.paths else "")
    )
    out.with_suffix(".md").write_text(park_card(p, args.zoo, command))
    print(f"wrote {out}: tau {taus}, {p.config['card']['timing']['total']:.0f}s")


if __name__ == "__main__":
    main()
