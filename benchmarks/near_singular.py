"""Geodesic sharpness of nearly singular zoo members, before and after a random group element.

The shipped ViT fine-tune zoo (``data/zoos/vit-finetune``) has members whose attention
blocks are nearly singular (member 65: a query-key product ``G H^T`` with smallest
singular value 2.6e-10 times its mean) or nearly zero (members 25, 80, 115: block
products of norm 1e-13 to 4e-3). Each member is moved by
``wsym.sharpness.correlation.scramble(spec, state, member)`` (a random element of the
whole group, scales 1e-2 to 1e2) and its worst-case sharpness (rho 0.1, 4 steps, the
first 64 training examples) is measured at both points.

``--diagonal`` evaluates at the diagonal balanced point alone (the evaluation point
before the GL balancing of ``docs/geometry.md`` section 2.1), for comparison.

Run:
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/near_singular.py
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/near_singular.py --diagonal
"""

import argparse
import warnings

import torch

import wsym
from wsym.sharpness import correlation, gauge, measures
from wsym.sharpness.quotient import Quotient
from wsym.zoo import load


def block_summary(spec, model) -> tuple[float, float]:
    """Smallest ``sigma_min / sigma_mean`` of a GL block product, and smallest ``|G H^T|``."""
    state = measures._base_point(spec, model.state_dict(), False)
    params = {n: state[n] for n, _ in model.named_parameters()}
    ratio, size = float("inf"), float("inf")
    for _, (G, H) in Quotient(spec, params).blocks:
        if G.shape[-1] < 2:
            continue
        s = torch.linalg.svdvals(G @ H.mT)[..., : G.shape[-1]]
        ratio = min(ratio, float((s[..., -1] / s.mean(-1)).min()))
        size = min(size, float(torch.linalg.matrix_norm(G @ H.mT).min()))
    return ratio, size


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, nargs="*", default=[65, 25, 80, 115])
    parser.add_argument("--measures", nargs="*", default=["geodesic-mix", "geodesic-inv"])
    parser.add_argument("--diagonal", action="store_true", help="the diagonal balanced point only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    if args.diagonal:
        measures._base_point = lambda spec, state, average, dtype: gauge.balanced(spec, state)
    zoo = load("data/zoos/vit-finetune")
    batches = correlation.training_subset(zoo, 64)
    ce = torch.nn.functional.cross_entropy
    spec = None
    point = "diagonal balanced point" if args.diagonal else "GL-balanced point"
    print(f"worst case, rho 0.1, 4 steps, 64 examples, at the {point}")
    print(f"{'member':>6} {'min s/mean':>11} {'min |GH^T|':>11} {'measure':<13} "
          f"{'before':>12} {'after':>12} {'change':>9}")  # fmt: skip
    for m in args.members:
        model = correlation.zoo_member(zoo, m)
        if spec is None:
            spec = wsym.detect(model, batches[0][0][:8].double())
        moved = correlation.zoo_member(zoo, m, correlation.scramble(spec, model.state_dict(), m))
        ratio, size = block_summary(spec, model)
        for measure in args.measures:
            kw = dict(spec=spec, measure=measure, rho=0.1, steps=4)
            a = wsym.sharpness(model, batches, ce, **kw)
            b = wsym.sharpness(moved, batches, ce, **kw)
            print(f"{m:>6} {ratio:>11.1e} {size:>11.1e} {measure:<13} {a:>12.5g} {b:>12.5g} "
                  f"{(b - a) / abs(a):>+9.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
