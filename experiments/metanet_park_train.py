"""Train the shipped park meta-network (``wsym predict`` on every park architecture).

    python experiments/metanet_park_train.py --zoo data/zoos/mnist1d-park \
        --out models/metanet-mnist1d-park.safetensors

Fits :func:`wsym.metanet.park_fit.fit_zoo` (the zoo's train split, val for
early stopping, target ``gap``), stores the specs of every architecture of the
zoo (held-out ones too), and writes the ``.safetensors`` file and its model card
(``.md``) with the test Kendall tau on the held-out members and architectures.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from wsym.metanet.park_fit import fit_zoo
from wsym.zoo import load


def card(p, zoo: str, taus: dict, seconds: float, command: str) -> str:
    """A short markdown model card."""
    rep, c = p.config["report"], p.config
    splits = c["card"]["splits"]
    lines = [
        f"# Meta-network: generalization gap on `{zoo}` (one network, every park architecture)",
        "",
        f"- architectures known: {len(p.schemas)} (every architecture of the zoo, held-out ones "
        "included)",
        f"- training: {splits['train']} train / {splits['val']} val members, seed {rep['seed']}, "
        f"best graph epoch {rep['best_epoch']} of {rep['epochs_run']}, {seconds:.0f}s on CPU",
        f"- held-out members ({splits['test']}): Kendall tau {taus.get('test', float('nan')):.3f}",
        f"- held-out architectures ({splits['test_arch']}): Kendall tau "
        f"{taus.get('test_arch', float('nan')):.3f}",
        f"- validation Kendall tau: statistics branch {rep['statistics_val_tau']:.3f}, graph "
        f"branch alone {rep.get('graph_val_tau', float('nan')):.3f}, blended "
        f"{rep['val_tau']:.3f} (graph weight {rep.get('graph_weight', 1.0)}, chosen on the "
        "validation members)",
        f"- network: universal role-featured graphs, {c['layers']} message-passing layers, "
        f"width {c['hidden']}; statistics branch {c['members']} perceptrons"
        + (f" + {c['trees']} boosted trees" if c.get("trees") else ""),
        "- invariant to each member's whole symmetry group (canonical forms + message passing)",
        "- bare checkpoints are matched to the known architectures by tensor names and shapes; "
        "where several share them (MLPs differing only in the activation) the prediction is "
        "the mean over those",
        f"- command: `{command}`",
        "",
    ]
    return "\n".join(lines)


def main() -> None:  # noqa: D103
    parser = argparse.ArgumentParser()
    parser.add_argument("--zoo", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--patience", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--trees", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    p, taus = fit_zoo(
        load(args.zoo),
        seed=args.seed,
        epochs=args.epochs,
        patience=args.patience,
        hidden=args.hidden,
        trees=args.trees,
    )
    seconds = time.perf_counter() - start
    p.config["card"]["seconds"] = seconds
    out = Path(args.out)
    p.save(out)
    command = (
        f"python experiments/metanet_park_train.py --zoo {args.zoo} --out {args.out} "
        f"--seed {args.seed} --epochs {args.epochs} --patience {args.patience} "
        f"--hidden {args.hidden} --trees {args.trees}"
    )
    out.with_suffix(".md").write_text(card(p, args.zoo, taus, seconds, command))
    print(f"wrote {out}: tau {taus}, {seconds:.0f}s")


if __name__ == "__main__":
    main()
