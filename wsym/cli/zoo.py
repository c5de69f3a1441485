"""``wsym zoo build``, ``info``, ``sharpness``: build (or resume) a zoo, describe it, measure it."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from wsym.cli.common import EXIT_OK, add_command
from wsym.errors import WsymInputError

_EXAMPLE = """\
examples:
  wsym zoo build --preset mnist1d-mlp --members 500 --out zoos/mlp --seed 0
  wsym zoo build --preset mnist1d-mlp --members 1000 --out zoos/mlp --workers 2
  wsym zoo build --preset digits-cnn --members 200 --out zoos/cnn --backend ray --workers 4
  wsym zoo info zoos/mlp --plot gaps.png
  wsym zoo info zoos/mlp --json
  wsym zoo info data/zoos/mnist1d-park --by family
  wsym zoo sharpness zoos/mlp --out runs/mlp-sharpness --measures adaptive geodesic-mix \
      --rho 0.05 --backend ray --address HEAD:6379

presets: mnist1d-mlp, mnist1d-mlp-widths, mnist1d-cnn, digits-cnn, seq-transformer,
diagonal, mnist1d-park, or a path to a preset .json file. Running build again on the
same --out resumes.
"""
_QUANTILES = (0.0, 0.25, 0.5, 0.75, 1.0)
_COLUMNS = ("gap", "train_acc", "test_acc", "train_loss", "test_loss")
# member splits (wsym.zoo.SPLITS, without importing torch); test_arch shown where present
_SPLITS = ("train", "val", "test", "test_arch")


def add_command_to(commands: Any) -> None:
    """Add ``zoo`` (with ``build`` and ``info``) to the ``wsym`` parser."""
    zoo = add_command(commands, "zoo", "build and describe model zoos", _EXAMPLE)
    actions = zoo.add_subparsers(dest="zoo_command", metavar="ACTION", required=True)
    build = add_command(actions, "build", "build or resume a model zoo", _EXAMPLE)
    build.add_argument("--preset", required=True, help="preset name or preset .json path")
    build.add_argument("--members", type=int, required=True, metavar="N", help="zoo size")
    build.add_argument("--out", required=True, metavar="DIR", help="zoo directory")
    build.add_argument("--seed", type=int, default=0, help="zoo seed (default 0)")
    build.add_argument("--backend", choices=("local", "ray"), default="local")
    build.add_argument(
        "--workers", type=int, default=1, metavar="K", help="worker processes (default 1)"
    )
    build.add_argument("--address", metavar="ADDR", help="Ray cluster address (--backend ray)")
    build.add_argument("--quiet", action="store_true", help="no progress bar")
    build.add_argument("--json", action="store_true", help="print the summary as JSON")
    build.set_defaults(handler=run_build)
    info = add_command(actions, "info", "describe a model zoo", _EXAMPLE)
    info.add_argument("dir", metavar="DIR", help="zoo directory")
    info.add_argument("--plot", metavar="PNG", help="write a histogram of the gaps")
    info.add_argument("--json", action="store_true", help="print a JSON summary")
    info.add_argument(
        "--by", metavar="KEY", help="also summarize per value of column KEY (e.g. family, split)"
    )
    info.set_defaults(handler=run_info)
    add_sharpness(actions)


def add_sharpness(actions: Any) -> None:
    """Add ``zoo sharpness``: every member's sharpness and each measure's tau with the gap."""
    run = add_command(
        actions, "sharpness", "measure every member's sharpness; Kendall tau with the gap", _EXAMPLE
    )
    run.add_argument("dir", metavar="DIR", help="zoo directory")
    run.add_argument("--out", required=True, metavar="DIR", help="results directory (resumed)")
    run.add_argument(
        "--measures",
        nargs="+",
        default=["adaptive", "geodesic-mix"],
        metavar="M",
        help="sharpness measures (default: adaptive geodesic-mix)",
    )
    run.add_argument("--rho", type=float, default=0.05, help="radius of every measure (0.05)")
    run.add_argument("--batch", type=int, default=256, help="first N training examples (256)")
    run.add_argument("--steps", type=int, default=10, help="ascent steps (default 10)")
    run.add_argument("--boot", type=int, default=1000, help="bootstrap resamples (1000)")
    run.add_argument("--backend", choices=("local", "ray"), default="local")
    run.add_argument(
        "--workers", type=int, default=1, metavar="K", help="worker processes (default 1)"
    )
    run.add_argument("--address", metavar="ADDR", help="Ray cluster address (--backend ray)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--json", action="store_true", help="print the taus as JSON")
    run.set_defaults(handler=run_sharpness)


def run_build(args: argparse.Namespace) -> int:
    """``wsym zoo build``: build or resume, then print the summary."""
    import wsym.zoo

    if args.address and args.backend != "ray":
        raise WsymInputError("--address needs --backend ray")
    zoo = wsym.zoo.build(
        args.preset,
        members=args.members,
        out=args.out,
        seed=args.seed,
        backend=args.backend,
        workers=args.workers,
        progress=not args.quiet,
        address=args.address,
    )
    numbers = summary(zoo)
    print(json.dumps(numbers) if args.json else format_summary(numbers))
    return EXIT_OK


def run_sharpness(args: argparse.Namespace) -> int:
    """``wsym zoo sharpness``: measure (or resume), then print each measure's tau."""
    from wsym.zoo.measure import measure_sharpness

    if args.address and args.backend != "ray":
        raise WsymInputError("--address needs --backend ray")
    result = measure_sharpness(
        args.dir,
        args.out,
        measures=args.measures,
        rho=args.rho,
        batch=args.batch,
        steps=args.steps,
        boot=args.boot,
        backend=args.backend,
        workers=args.workers,
        address=args.address,
        progress=not args.quiet,
    )
    taus = {m: None if t is None else vars(t) for m, t in result.tau.items()}
    if args.json:
        print(json.dumps({"members": len(result.rows), "tau": taus}))
    else:
        print(f"{len(result.rows)} members; Kendall tau with the gap, results in {args.out}")
        for m, t in result.tau.items():
            print(f"{m:>14}: {'n/a (fewer than 3 members)' if t is None else t}")
    return EXIT_OK


def run_info(args: argparse.Namespace) -> int:
    """``wsym zoo info``: sizes and gap distribution, optionally a histogram PNG."""
    import wsym.zoo

    if args.plot and not Path(args.plot).parent.is_dir():
        raise WsymInputError(f"cannot write {args.plot}: its directory does not exist")
    zoo = wsym.zoo.load(args.dir)
    info = summary(zoo)
    if args.by:
        info["by"] = {args.by: summary_by(zoo, args.by)}
    if args.plot:
        plot_gaps(zoo, args.plot)
        info["plot"] = args.plot
    print(json.dumps(info, indent=1) if args.json else format_summary(info))
    return EXIT_OK


def summary(zoo: Any) -> dict[str, Any]:
    """Members, splits, bytes on disk and quantiles of gap and accuracies."""
    table = zoo.table
    files = [p for p in zoo.path.rglob("*") if p.is_file()]
    info = {
        "path": str(zoo.path),
        "preset": zoo.manifest["preset"],
        "seed": zoo.manifest["seed"],
        "members": len(table),
        "planned": zoo.manifest["members"],
        "splits": {s: n for s in _SPLITS if (n := len(zoo.split(s))) or s != "test_arch"},
        "bytes": sum(p.stat().st_size for p in files),
        "gap_definition": zoo.manifest["gap"],
    }
    info.update(_distributions(table))
    return info


def summary_by(zoo: Any, key: str) -> dict[str, dict[str, Any]]:
    """Members and quantiles of gap and accuracies per value of the column ``key``."""
    if zoo.table and key not in zoo.table[0]:
        raise WsymInputError(
            f"zoo members have no column {key!r}; use one of {', '.join(zoo.table[0])}"
        )
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in zoo.table:
        groups.setdefault(str(row[key]), []).append(row)
    return {v: {"members": len(rows), **_distributions(rows)} for v, rows in sorted(groups.items())}


def _distributions(table: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out = {}
    for key in _COLUMNS:
        values = [row[key] for row in table if not math.isnan(row[key])]
        if values:
            names = ("min", "q25", "median", "q75", "max")
            out[key] = dict(zip(names, _quantiles(values), strict=True))
    return out


def format_summary(info: dict[str, Any]) -> str:
    """Human-readable lines of :func:`summary`."""
    lines = [
        f"zoo {info['path']}: preset {info['preset']}, seed {info['seed']}, "
        f"{info['members']}/{info['planned']} members, {info['bytes'] / 1e6:.2f} MB",
        "member splits: " + ", ".join(f"{k} {v}" for k, v in info["splits"].items()),
        f"gap = {info['gap_definition']}",
    ]
    lines += _quantile_lines(info)
    for key, groups in info.get("by", {}).items():
        for value, group in groups.items():
            lines.append(f"{key} = {value}: {group['members']} members")
            lines += ["  " + line for line in _quantile_lines(group, ("test_acc", "gap"))]
    if "plot" in info:
        lines.append(f"histogram written to {info['plot']}")
    return "\n".join(lines)


def _quantile_lines(info: dict[str, Any], keys=None) -> list[str]:
    lines = []
    for key in keys or _COLUMNS:
        if key in info:
            q = info[key]
            lines.append(
                f"{key:>10}: min {q['min']:.4f}  q25 {q['q25']:.4f}  median {q['median']:.4f}"
                f"  q75 {q['q75']:.4f}  max {q['max']:.4f}"
            )
    return lines


def plot_gaps(zoo: Any, path: str) -> None:
    """Histogram of the members' gaps, saved as a PNG."""
    import io

    import matplotlib

    from wsym.io.atomic import write_atomic

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gaps = [row["gap"] for row in zoo.table if not math.isnan(row["gap"])]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.hist(gaps, bins=30, color="tab:blue")
    ax.set_xlabel(f"gap ({zoo.manifest['gap']})")
    ax.set_ylabel("members")
    ax.set_title(f"{zoo.manifest['preset']}: {len(gaps)} members")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    write_atomic(Path(path), buffer.getvalue())


def _quantiles(values: list[float]) -> list[float]:
    ordered = sorted(values)
    out = []
    for q in _QUANTILES:
        pos = q * (len(ordered) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        out.append(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))
    return out
