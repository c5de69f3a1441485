"""Zoo training speed: batched vs a plain per-member loop, FLOP/s, and a 1,000-member build.

One run measures, on mnist1d-mlp members (one thread each, as zoo training runs):

1. members/minute of :func:`wsym.zoo.batched.train_members` on N members (the
   preset's sampled hyperparameters: SGD/Adam, lr, weight decay, batch size,
   epochs, dropout, train fraction, label noise; by default N is the preset's
   ``shard_size``, 250, and the members are the zoo's shard 0, ids 0-249: the
   stack a ``wsym zoo build`` trains as one unit) vs a plain loop training the
   same members one after another (``nn.Module`` + ``torch.optim`` + dropout
   hooks, the same data order and the same number of steps, plus the same
   evaluation); and the same on N members sharing one schedule (batch size 64,
   10 epochs, full data), where batching is not held back by stragglers;
2. achieved FLOP/s of the batched training (matmul FLOPs, forward 2mnk and
   backward 4mnk per linear layer, plus the evaluation's forward) as a fraction of a
   2048x2048 float32 matmul's FLOP/s measured in the same run, on one thread (per
   wall-clock second, and per CPU second of this process);
3. the projected time of a 1,000-member mnist1d-mlp zoo, and with ``--full`` the
   actual ``wsym.zoo.build`` time (``--workers`` processes, default 2).

Run::

    PYTHONPATH=. .venv/bin/python benchmarks/zoo_speed.py [--members 250] [--full] [--json out.json]

Other processes on the machine slow every number here; the ratios are measured
interleaved (four batched runs of all N members, each followed by a quarter of
the plain loop), so they are less affected than the absolute rates. Each
ratio is given in wall-clock time and in CPU time of this process (both sides run
on one thread), which does not count the time other processes held the core.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch
from torch.nn import functional as F

import wsym.zoo
from wsym.zoo.architectures import initialise
from wsym.zoo.backends import plan_member
from wsym.zoo.batched import train_members
from wsym.zoo.presets import load_preset
from wsym.zoo.streams import DataStream, member_streams
from wsym.zoo.tasks import load_task


def plain_member(preset, data, member):
    """One member the ordinary way: a module, torch.optim, a loop, then evaluation."""
    hp = member.hyperparameters
    seeds = member_streams(member.seed)
    model = initialise(member.architecture, seeds["init"], hp["init_scale"]).train()
    stream = DataStream(data, hp, seeds["data"], hp["batch_size"], regression=False)
    gen = torch.Generator().manual_seed(seeds["dropout"])
    rate = hp["dropout"]

    def dropout(module, inputs, out):
        if not module.training:
            return out
        return out * ((torch.rand(out.shape, generator=gen) >= rate) / (1 - rate))

    if rate > 0:
        for site in preset["dropout_sites"]:
            dict(model.named_modules())[site].register_forward_hook(dropout)
    cls = torch.optim.Adam if hp["optimizer"] == "adam" else torch.optim.SGD
    extra = {} if hp["optimizer"] == "adam" else {"momentum": 0.9}
    opt = cls(model.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"], **extra)
    steps = 0
    while steps < stream.total_steps:
        for idx in stream.next_block():
            if steps == stream.total_steps:
                break
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(data.x_train[idx]), stream.targets[idx]).backward()
            opt.step()
            steps += 1
    model.eval()
    with torch.no_grad():
        model(data.x_train), model(data.x_test)
    return steps


def matmul_flops(preset, members, data) -> float:
    """Matmul FLOPs of training (fwd+bwd) and evaluation of MLP members."""
    total = 0.0
    for m in members:
        dims = [m.architecture["d_in"], *m.architecture["widths"], m.architecture["d_out"]]
        macs = sum(a * b for a, b in zip(dims[:-1], dims[1:], strict=True))
        stream = DataStream(data, m.hyperparameters, 0, m.hyperparameters["batch_size"], False)
        total += 6 * macs * stream.total_steps * m.hyperparameters["batch_size"]
        total += 2 * macs * (len(data.x_train) + len(data.x_test))
    return total


def peak_flops(n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of a float32 ``n x n`` matmul, best of ``repeats``."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _run(fn) -> tuple[float, float]:
    """Wall-clock and CPU (this process) seconds of ``fn()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def compare(preset, data, members, label, rounds: int = 4) -> dict:
    """Batched vs plain on ``members``, interleaved so both see the same machine load.

    ``rounds`` times: train all members batched, then a slice (``1/rounds``)
    of them with the plain loop; the plain time is the sum over slices, the
    batched time the mean over rounds.
    """
    batched = batched_cpu = plain = plain_cpu = 0.0
    for r in range(rounds):
        wall, cpu = _run(lambda: train_members(preset, data, members))
        batched, batched_cpu = batched + wall / rounds, batched_cpu + cpu / rounds
        wall, cpu = _run(lambda r=r: [plain_member(preset, data, m) for m in members[r::rounds]])
        plain, plain_cpu = plain + wall, plain_cpu + cpu
    n = len(members)
    result = {
        "members": n,
        "batched_s": batched,
        "plain_s": plain,
        "batched_cpu_s": batched_cpu,
        "plain_cpu_s": plain_cpu,
        "batched_members_per_min": 60 * n / batched,
        "plain_members_per_min": 60 * n / plain,
        "ratio": plain / batched,
        "ratio_cpu": plain_cpu / batched_cpu,
        "flops_per_s": matmul_flops(preset, members, data) / batched,
        "flops_per_cpu_s": matmul_flops(preset, members, data) / batched_cpu,
    }
    print(
        f"{label}: {n} members  batched {batched:.1f}s ({result['batched_members_per_min']:.0f}"
        f"/min)  plain loop {plain:.1f}s ({result['plain_members_per_min']:.0f}/min)  "
        f"ratio {result['ratio']:.1f}x (CPU time: {batched_cpu:.1f}s vs {plain_cpu:.1f}s, "
        f"{result['ratio_cpu']:.1f}x)",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--members",
        type=int,
        help="members per comparison (default: the preset's shard_size, what a build stacks)",
    )
    parser.add_argument("--full", action="store_true", help="also build a 1,000-member zoo")
    parser.add_argument("--workers", type=int, default=2, help="processes for --full")
    parser.add_argument("--json", help="write the numbers to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    preset = load_preset("mnist1d-mlp")
    data = load_task(preset["dataset"])
    if args.members is None:  # a build trains each shard of shard_size members as one stack
        args.members = int(preset["shard_size"])
    print(f"{args.members} members per stack (shard_size {preset['shard_size']})", flush=True)
    peak = peak_flops()
    print(f"large matmul (2048^2, float32, 1 thread): {peak / 1e9:.1f} GFLOP/s", flush=True)
    # warm-up (one-time costs of a process: lazy initialisation in torch), both sides
    tiny = load_preset("mnist1d-mlp", {"hyperparameters": {"epochs": 1, "train_fraction": 0.05}})
    warm = [plan_member(tiny, 0, i) for i in range(2)]
    train_members(tiny, data, warm)
    plain_member(tiny, data, warm[0])
    sampled = [plan_member(preset, 0, i) for i in range(args.members)]
    fixed_hp = {"batch_size": 64, "epochs": 10, "train_fraction": 1.0}
    fixed_preset = load_preset("mnist1d-mlp", {"hyperparameters": fixed_hp})
    fixed = [plan_member(fixed_preset, 0, i) for i in range(args.members)]
    results = {
        "peak_flops_per_s": peak,
        "sampled": compare(preset, data, sampled, "sampled hyperparameters"),
        "one_schedule": compare(fixed_preset, data, fixed, "one schedule (bs 64, 10 epochs)"),
    }
    for key in ("sampled", "one_schedule"):
        r = results[key]
        r["flops_fraction_of_matmul"] = r["flops_per_s"] / peak
        r["flops_fraction_of_matmul_cpu"] = r["flops_per_cpu_s"] / peak
        print(
            f"{key}: zoo training {r['flops_per_s'] / 1e9:.2f} GFLOP/s = "
            f"{100 * r['flops_fraction_of_matmul']:.1f}% of the large matmul "
            f"(per CPU second: {r['flops_per_cpu_s'] / 1e9:.2f} GFLOP/s = "
            f"{100 * r['flops_fraction_of_matmul_cpu']:.1f}%)"
        )
    per_member = results["sampled"]["batched_s"] / args.members
    results["projected_1000_s_one_process"] = 1000 * per_member
    print(f"projected 1,000-member mnist1d-mlp zoo, one process: {1000 * per_member / 60:.1f} min")
    if args.full:
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            wsym.zoo.build("mnist1d-mlp", 1000, out, workers=args.workers, progress=True)
            results["actual_1000_s"] = time.perf_counter() - start
        print(
            f"actual 1,000-member mnist1d-mlp zoo, {args.workers} workers: "
            f"{results['actual_1000_s'] / 60:.1f} min"
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
