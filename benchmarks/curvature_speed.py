"""Time a gradient and a Hessian-vector product (forward-over-reverse) on two models.

Goal: an HVP costs at most 3x a gradient. Models: an mnist1d-like MLP
40 -> 512 -> 512 -> 10 on a batch of 256, and ``wsym.models.networks.TinyTransformer()``
(default config) on a float input (64, 10, 4). Median of 10 timed calls
(``time.perf_counter``) after warm-up, float32.

Run:
    .venv/bin/python benchmarks/curvature_speed.py [--device cuda] [--repeats 10]
"""

import argparse
import statistics
import time

import torch
from torch import nn

from wsym.models.networks import MLP, TinyTransformer
from wsym.sharpness.curvature import gradient, hvp
from wsym.sharpness.curvature.objective import model_params


def median_times(fns, repeats, device):
    """Median seconds of each function; calls are interleaved so load hits all alike."""
    for fn in fns:  # warm-up (the first forward-mode call loads torch's jvp decompositions)
        fn()
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times, strict=True):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            ts.append(time.perf_counter() - start)
    return [statistics.median(ts) for ts in times]


def bench(name, model, x, y, repeats, device):
    model, x, y = model.to(device), x.to(device), y.to(device)
    batches, loss = [(x, y)], nn.CrossEntropyLoss()
    params = model_params(model)
    gen = torch.Generator().manual_seed(0)
    v = {n: torch.randn(p.shape, generator=gen).to(p) for n, p in params.items()}
    t_grad, t_fwd, t_rev = median_times(
        [
            lambda: gradient(model, params, batches, loss),
            lambda: hvp(model, params, batches, loss, v),  # forward-over-reverse (default)
            lambda: hvp(model, params, batches, loss, v, mode="reverse"),
        ],
        repeats,
        device,
    )
    size = sum(p.numel() for p in params.values())
    print(f"{name} ({size} parameters)")
    print(f"  gradient                      {t_grad * 1e3:8.2f} ms")
    for label, t in (("forward-over-reverse", t_fwd), ("reverse-over-reverse", t_rev)):
        verdict = "ok" if t <= 3 * t_grad else "over 3x"
        print(f"  hvp {label}  {t * 1e3:8.2f} ms  {t / t_grad:5.2f}x gradient ({verdict})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}")
    bench(
        "MLP 40-512-512-10",
        MLP(40, [512, 512], 10),
        torch.randn(256, 40),
        torch.randint(0, 10, (256,)),
        args.repeats,
        device,
    )
    bench(
        "TinyTransformer",
        TinyTransformer(),
        torch.randn(64, 10, 4),
        torch.randint(0, 10, (64,)),
        args.repeats,
        device,
    )


if __name__ == "__main__":
    main()
