"""Why does a scramble move an invariant measure? Member by member, where it happens.

For the members given, on a fine-tune zoo (``--zoo``): geodesic-inv and
geodesic-mix worst-case sharpness (``--rho``, first 256 training examples)
before and after the member is moved by ``spec.sample(seed, scale)``, for two
scale ranges (the experiment's ``(1e-2, 1e2)`` and a mild ``(0.5, 2)``) and after
1 and 10 ascent steps. One step is the first gradient step of the ascent, before
any of its decisions (step-size halving, best-so-far): a change there comes from
the geometry (metric, projection), not from the ascent's path.

Then the worst GL block of the member (smallest ``sigma_min / sigma_max``, see
``experiments/finetune_sharpness.py``), before and after the experiment's
scramble: the extreme singular values of both factors ``G`` and ``H``, the
condition number of their Gram matrices ``M^T M``, and the regularization shift
that the quotient adds to those Gram matrices (``EPS * Tr(M^T M) / h``,
:mod:`wsym.sharpness.perturbation`) relative to their smallest eigenvalue
``sigma_min^2``. The shift is not GL-equivariant: where it is not negligible
against ``sigma_min^2``, the regularized metric is not invariant.

Run::

    .venv/bin/python experiments/scramble_members.py --zoo data/zoos/vit-finetune 65 4
"""

from __future__ import annotations

import argparse
import warnings

import torch
from finetune_sharpness import conditioning

import wsym
import wsym.zoo
from wsym.sharpness import perturbation
from wsym.sharpness.blocks import gather
from wsym.sharpness.correlation import scramble, training_subset, zoo_member

SCALES = ((1e-2, 1e2), (0.5, 2.0))


def block_report(spec, model, where: str) -> list[str]:
    """Singular values, Gram condition and shift of the block ``where`` names."""
    notation, name, _, head, _ = where.split(" ")
    params = {k: v.detach() for k, v in model.named_parameters()}
    lines = []
    for group, pair in gather(spec, params):
        if spec.groups[group].params[0] != name:
            continue
        for side, mat in zip("GH", pair, strict=True):
            m = mat.reshape(-1, *mat.shape[-2:])[int(head)]
            sv = torch.linalg.svdvals(m)
            shift = perturbation.EPS * float((sv**2).mean())
            lines.append(
                f"    {side}: sigma {float(sv[0]):.2e} .. {float(sv[-1]):.2e}, "
                f"cond(M^T M) {float(sv[0] / sv[-1]) ** 2:.1e}, "
                f"shift / sigma_min^2 {shift / float(sv[-1]) ** 2:.1e}"
            )
    return lines


def main(argv=None):
    """Measure each member before and after its scramble; print where it moves."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("members", type=int, nargs="+")
    ap.add_argument("--zoo", default="data/zoos/vit-finetune")
    ap.add_argument("--rho", type=float, default=0.05)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    zoo = wsym.zoo.load(args.zoo)
    batches = training_subset(zoo, 256)
    spec = wsym.detect(zoo_member(zoo, zoo.ids[0]).float(), batches[0][0][:8])
    loss = torch.nn.functional.cross_entropy
    for member in args.members:
        model = zoo_member(zoo, member)
        print(f"member {member}:")
        for scale in SCALES:
            moved = zoo_member(zoo, member, scramble(spec, model.state_dict(), member, scale))
            for measure in ("geodesic-inv", "geodesic-mix"):
                cells = []
                for steps in (1, 10):
                    a, b = (
                        wsym.sharpness(
                            m, batches, loss, spec=spec, measure=measure, rho=args.rho, steps=steps
                        )
                        for m in (model, moved)
                    )
                    cells.append(f"{steps:>2} steps {a:.6g} -> {b:.6g} ({abs(b - a) / abs(a):.1e})")
                print(f"  scale {scale}, {measure:<12}: " + "; ".join(cells))
        moved = zoo_member(zoo, member, scramble(spec, model.state_dict(), member))
        ratio, where = conditioning(spec, model)
        print(f"  worst GL block {where} (sigma_min / sigma_max {ratio:.1e}):")
        for tag, m in (("before", model), ("after the (1e-2, 1e2) scramble", moved)):
            print(f"   {tag}:")
            print("\n".join(block_report(spec, m, where)))


if __name__ == "__main__":
    main()
