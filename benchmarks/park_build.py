"""Build cost of the park zoo (``mnist1d-park``) per family, and the full preset's projected time.

Trains the members of the park's first ``--blocks`` architecture blocks of each
family (block ``b`` is family ``b mod 3``; a block is one batched group, as
``wsym zoo build`` trains it), each family's blocks in turn, on one thread, and
prints per family: members, CPU seconds per member (this process only, so other
jobs on the machine barely change it), wall seconds per member, mean training
steps per member and mean test accuracy. Then it projects the full preset,
``--members`` (default 2,000) members in the preset's proportions, on
``--workers`` processes: ``sum over families of members x CPU s/member / workers``
(an idle machine; a busy one stretches the wall time, not the CPU time).

Run::

    PYTHONPATH=. .venv/bin/python benchmarks/park_build.py [--blocks 4] [--workers 2] \
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from wsym.zoo.backends import plan_member, train_unit
from wsym.zoo.presets import load_preset

FAMILIES = ("mlp", "cnn", "transformer")


def measure(blocks: int) -> dict[str, dict[str, float]]:
    """Per family: members, CPU and wall seconds per member, mean steps and test accuracy."""
    preset = load_preset("mnist1d-park")
    size = int(preset["architecture_blocks"]["size"])
    train_unit(preset, 0, [0])  # generates and caches the dataset outside the timings
    out = {}
    for f, family in enumerate(FAMILIES):
        ids = [
            b * size + i for b in range(f, 3 * blocks, 3) for i in range(size)
        ]  # this family's first blocks
        assert {plan_member(preset, 0, i).hyperparameters["family"] for i in ids} == {family}
        cpu, wall = time.process_time(), time.perf_counter()
        results = [
            r for b in range(0, len(ids), size) for r in train_unit(preset, 0, ids[b : b + size])
        ]
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        out[family] = {
            "members": len(ids),
            "cpu_s_per_member": cpu / len(ids),
            "wall_s_per_member": wall / len(ids),
            "mean_steps": sum(r.metrics["steps"] for r in results) / len(ids),
            "mean_test_acc": sum(r.metrics["test_acc"] for r in results) / len(ids),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=4, help="blocks per family (default 4)")
    parser.add_argument("--members", type=int, default=2000, help="full zoo size to project")
    parser.add_argument("--workers", type=int, default=2, help="build processes to project for")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = measure(args.blocks)
    print("| family | members | CPU s / member | wall s / member | mean steps | mean test acc |")
    print("|---|---|---|---|---|---|")
    for family, r in rows.items():
        print(
            f"| {family} | {r['members']} | {r['cpu_s_per_member']:.2f} | "
            f"{r['wall_s_per_member']:.2f} | {r['mean_steps']:.0f} | {r['mean_test_acc']:.3f} |"
        )
    cpu = sum(args.members / len(FAMILIES) * r["cpu_s_per_member"] for r in rows.values())
    print(
        f"projected `wsym zoo build --preset mnist1d-park --members {args.members} "
        f"--workers {args.workers}`: {cpu:.0f} CPU s, ~{cpu / args.workers / 60:.0f} min wall "
        f"on {args.workers} idle cores"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"families": rows, "projected_cpu_s": cpu, **vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
