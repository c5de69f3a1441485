"""Alignment benchmark: loss barriers after wsym.align, against no alignment and ``rebasin``.

Run from the repository root (``rebasin`` must be installed; it is not a wsym
dependency)::

    .venv/bin/python benchmarks/alignment.py [--json PATH] [--quick] [--only NAME ...]

In one run it trains pairs of models from different seeds (different
initialization and data order) on mnist1d: ``MLP(40, [w, w], 10)`` for w in
64, 256, 512 and ``CNN1d`` (SGD, lr 0.05, momentum 0.9, 30 epochs), the
Git Re-Basin-shaped ``MLP(40, [512, 512, 512], 10)`` on ``mnist1d-large``
(20000 training examples instead of 4000, which 512-wide MLPs memorize; SGD as
above, EPOCHS_LARGE epochs), and a ``TinyTransformer`` on ``mnist1d-seq``
(Adam, lr 3e-3). For each pair it moves model B onto model A's basis with

* ``naive``: no alignment;
* ``weights``: ``wsym.align(..., method="weights")``;
* ``activations``: ``wsym.align(..., method="activations")`` on 4 train batches of 256;
* ``rebasin``: ``rebasin.PermutationCoordinateDescent`` (PyPI ``rebasin``) on a copy,

and reports the loss barrier (largest excess of the loss over the straight line
between the endpoint losses, 11 points) on the train and the test split, with
wall times (median of ``--repeats``, this run, this machine, one torch thread).

What is timed, like with like: rebasin's region is its whole use on the two
models, ``PermutationCoordinateDescent(model_a, model_b, x)`` (tracing the
model and building its permutation graph) plus ``.rebasin()`` (coordinate
descent and permuting model B in place); only the deep copy of model B that
keeps the original intact is outside it. wsym's set-up is ``wsym.detect``
(tracing, plus verifying every group by acting on the model, which rebasin
does not do), then ``wsym.align`` (canonicalizing both state dicts,
coordinate descent, applying the permutations, returning a new state dict).
The table gives both seconds and both ratios: ``rebasin/(detect+wsym)`` is
the like-with-like one for a single pair; ``rebasin/wsym`` is the one that
applies when one detected spec serves many checkpoints (a zoo, a sweep).

BatchNorm (CNN1d): ``wsym.interpolate`` interpolates running statistics along
with the weights. rebasin permutes BatchNorm weights but not running statistics,
so its model B computes a different function ("as is"); the row "rebasin + BN
recomputed" resets the running statistics of its model B on the train split
(``wsym.merge.reset_batchnorm_stats``). The row "BN reset per point" recomputes
the statistics at every point of every path (the usual protocol for BatchNorm
networks; then rebasin's unpermuted statistics do not matter).

Diagnostic (not in the table): ``weights, perm only`` runs wsym's weight
matching on the raw weights, without canonicalizing the continuous and sign
groups first (``wsym.align.weight_matching`` and ``wsym.act.act``), to show what
canonicalization changes.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from time import perf_counter

import torch
from torch.nn import functional as F

import wsym
from wsym.act import GroupElement, act
from wsym.align import weight_matching
from wsym.connectivity import Curve
from wsym.data import load
from wsym.merge import reset_batchnorm_stats
from wsym.reference import MLP, Block, CNN1d, TinyTransformer
from wsym.train import evaluate, train

STEPS = 11
EPOCHS_LARGE = 10
SEEDS = (0, 1)
SGD = {"lr": 0.05, "optimizer": "sgd", "batch_size": 128}
ADAM = {"lr": 3e-3, "optimizer": "adam", "batch_size": 128}


class ViT(torch.nn.Module):
    """A small ViT: 2x2 patches of an image, class token, positions, pre-LN blocks, LN head.

    Example:
        >>> ViT()(torch.randn(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """

    def __init__(self, dim: int = 32, heads: int = 4, depth: int = 2, hidden: int = 64):
        super().__init__()
        self.patch = torch.nn.Conv2d(1, dim, 2, stride=2)
        self.cls = torch.nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = torch.nn.Parameter(torch.randn(17, dim) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(dim, heads, hidden) for _ in range(depth))
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for images ``(B, 1, 8, 8)``."""
        h = self.patch(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1) + self.pos
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h)[:, 0])


def trained_pair(cfg: dict, cache: Path):
    """``(model_a, model_b, data, training results)``, trained once, then from the cache.

    State dicts are cached with ``torch.save`` and read with ``weights_only=True``.
    """
    data = load(cfg["data"])
    models, results = [], []
    for seed in SEEDS:
        torch.manual_seed(seed)
        model = cfg["make"]()
        tag = "-".join(f"{k}{v}" for k, v in sorted(cfg["train"].items()))
        path = cache / f"{cfg['name']}-{tag}-{seed}.pt"
        if path.exists():
            saved = torch.load(path, weights_only=True)
            model.load_state_dict(saved["state_dict"])
            result = saved["result"]
        else:
            start = time.process_time()
            result = train(model, data, seed=seed, **cfg["train"])
            result["train_seconds"] = time.process_time() - start
            cache.mkdir(parents=True, exist_ok=True)
            torch.save({"state_dict": model.state_dict(), "result": result}, path)
        models.append(model.eval())
        results.append(result)
    return models[0], models[1], data, results


def configs(quick: bool) -> list[dict]:
    """The model pairs: name, factory, dataset, training arguments, whether rebasin runs."""
    epochs = 1 if quick else 30
    out = [
        {
            "name": f"mlp-{w}",
            "make": lambda w=w: MLP(40, [w, w], 10),
            "data": "mnist1d",
            "train": SGD | {"epochs": epochs},
        }
        for w in (64, 256, 512)
    ]
    out.append(
        {
            "name": "mlp-512x3",
            "make": lambda: MLP(40, [512, 512, 512], 10),
            "data": "mnist1d-large",
            "train": SGD | {"epochs": 1 if quick else EPOCHS_LARGE},
        }
    )
    out.append(
        {"name": "cnn1d", "make": CNN1d, "data": "mnist1d", "train": SGD | {"epochs": epochs}}
    )
    out.append(
        {
            "name": "transformer",
            "make": lambda: TinyTransformer(patch=4, seq=10, dim=32, heads=4, depth=2, hidden=64),
            "data": "mnist1d-seq",
            "train": ADAM | {"epochs": epochs},
        }
    )
    out.append(
        {"name": "vit", "make": ViT, "data": "digits", "train": ADAM | {"epochs": 3 * epochs}}
    )
    return out


def timed(fn, repeats: int):
    """``(last result, median seconds)`` of ``repeats`` calls of ``fn``."""
    times, result = [], None
    for _ in range(repeats):
        start = perf_counter()
        result = fn()
        times.append(perf_counter() - start)
    return result, statistics.median(times)


def rebasin_align(model_a, model_b, x, repeats: int, seed: int = 0):
    """rebasin's permuted copy of ``model_b`` (state dict) and the median seconds."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from rebasin import PermutationCoordinateDescent

    def run():
        torch.manual_seed(seed)  # rebasin visits permutations in torch.randperm order
        net = copy.deepcopy(model_b)
        start = perf_counter()
        pcd = PermutationCoordinateDescent(model_a, net, x)
        pcd.rebasin(max_iterations=100)
        return net, perf_counter() - start

    times, net = [], None
    for _ in range(repeats):
        net, seconds = run()
        times.append(seconds)
    return {k: v.detach().clone() for k, v in net.state_dict().items()}, statistics.median(times)


def permutation_only(sd_a: dict, sd_b: dict, spec) -> dict:
    """wsym's weight matching on the raw weights (no canonicalization first)."""
    ref, other = (
        {k: v.double() if v.is_floating_point() else v for k, v in sd.items()}
        for sd in (sd_a, sd_b)
    )
    moved = act(spec, GroupElement(tuple(weight_matching(spec, ref, other))), other)
    return {k: v.to(sd_b[k].dtype) for k, v in moved.items()}


def output_change(model, sd_b: dict, sd_moved: dict, x) -> float:
    """Largest output change from ``sd_b`` to ``sd_moved``, relative to the largest output."""
    outs = []
    for sd in (sd_b, sd_moved):
        net = copy.deepcopy(model)
        net.load_state_dict(sd)
        net.eval()
        with torch.no_grad():
            outs.append(net(x).double())
    return float((outs[1] - outs[0]).abs().max() / outs[0].abs().max())


def l2(sd_a: dict, sd_b: dict) -> float:
    """Euclidean distance over the floating-point parameters and buffers."""
    total = sum(
        float(((v.double() - sd_b[k].double()) ** 2).sum())
        for k, v in sd_a.items()
        if v.is_floating_point()
    )
    return total**0.5


def curve_from(alphas, losses, accuracies) -> Curve:
    """A :class:`wsym.Curve` with the barriers defined as in ``wsym.interpolate``."""
    return Curve.from_points(alphas, losses, accuracies)


def has_batchnorm(model) -> bool:
    """Whether ``model`` holds a BatchNorm layer (its running statistics need a reset)."""
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())


def bn_reset_curves(model, sd_a: dict, sd_b: dict, reset_batches, splits: dict) -> dict:
    """Curves per split with BatchNorm statistics recomputed at every point of the path."""
    alphas = [i / (STEPS - 1) for i in range(STEPS)]
    results = {name: ([], []) for name in splits}
    net = copy.deepcopy(model)
    for a in alphas:
        sd = {
            k: ((1 - a) * v.double() + a * sd_b[k].double()).to(v.dtype)
            if v.is_floating_point()
            else v
            for k, v in sd_a.items()
        }
        net.load_state_dict(reset_batchnorm_stats(model, sd, reset_batches))
        for name, batches in splits.items():
            loss, acc = evaluate(net, batches)
            results[name][0].append(loss)
            results[name][1].append(acc)
    return {name: curve_from(alphas, *la) for name, la in results.items()}


def curve_json(curve: Curve) -> dict:
    return {
        "barrier": curve.barrier,
        "accuracy_barrier": curve.accuracy_barrier,
        "losses": list(curve.losses),
        "accuracies": list(curve.accuracies),
    }


def run_pair(cfg: dict, repeats: int) -> dict:
    """Train one pair, align B onto A every way, and measure the paths."""
    data = load(cfg["data"])
    models, accuracies = [], []
    for seed in SEEDS:
        torch.manual_seed(seed)
        model = cfg["make"]()
        start = perf_counter()
        result = train(model, data, seed=seed, **cfg["train"])
        result["train_seconds"] = perf_counter() - start
        models.append(model.eval())
        accuracies.append(result)
    model_a, model_b = models
    sd_a, sd_b = (
        {k: v.detach().clone() for k, v in m.state_dict().items()} for m in (model_a, model_b)
    )
    x_example = data.x_train[:64]
    spec, detect_s = timed(lambda: wsym.detect(model_a, x_example), repeats)
    splits = {"train": list(data.batches("train", 1000)), "test": list(data.batches("test", 1000))}
    act_batches = list(data.batches("train", 256, seed=0, shuffle=True))[:4]

    methods: dict[str, dict] = {"naive": {"sd": sd_b, "seconds": 0.0}}
    sd, seconds = timed(lambda: wsym.align(sd_a, sd_b, spec, "weights"), repeats)
    methods["weights"] = {"sd": sd, "seconds": seconds}
    sd, seconds = timed(
        lambda: wsym.align(sd_a, sd_b, spec, "activations", model=model_a, batches=act_batches),
        repeats,
    )
    methods["activations"] = {"sd": sd, "seconds": seconds}
    try:
        sd, seconds = rebasin_align(model_a, model_b, x_example, repeats)
        methods["rebasin"] = {"sd": sd, "seconds": seconds}
    except Exception as err:  # noqa: BLE001 - reported in the table
        text = str(err).strip().splitlines()[0] if str(err).strip() else ""
        methods["rebasin"] = {"error": f"{type(err).__name__}: {text}"[:300]}

    sd, seconds = timed(lambda: permutation_only(sd_a, sd_b, spec), repeats)
    methods["weights, perm only"] = {"sd": sd, "seconds": seconds}

    has_bn = has_batchnorm(model_a)
    if has_bn and "sd" in methods["rebasin"]:
        methods["rebasin + BN recomputed"] = {
            "sd": reset_batchnorm_stats(model_a, methods["rebasin"]["sd"], splits["train"]),
            "seconds": methods["rebasin"]["seconds"],
        }

    x_check = data.x_test[:256]
    for name, m in methods.items():
        if "sd" not in m:
            continue
        m["l2_to_a"] = l2(sd_a, m["sd"])
        m["output_change"] = output_change(model_a, sd_b, m["sd"], x_check)
        for split, batches in splits.items():
            m[split] = wsym.interpolate(model_a, sd_a, m["sd"], batches, F.cross_entropy, STEPS)
        if has_bn and name != "rebasin + BN recomputed":
            m["bn_reset"] = bn_reset_curves(model_a, sd_a, m["sd"], splits["train"], splits)

    return {
        "name": cfg["name"],
        "data": cfg["data"],
        "train_args": cfg["train"],
        "parameters": sum(p.numel() for p in model_a.parameters()),
        "groups": len(spec.groups),
        "detect_seconds": detect_s,
        "accuracies": accuracies,
        "methods": methods,
    }


def cell(m: dict | None, curve_of, naive: float | None) -> str:
    """A barrier cell: value, ratio to naive, ``*`` if the function changed."""
    if m is None:
        return "n/a"
    if "error" in m:
        return "error (below)"
    b = curve_of(m).barrier
    star = " *" if m["output_change"] > 1e-3 else ""
    return f"{b:.3f} ({b / naive:.2f}x){star}" if naive else f"{b:.3f}{star}"


def table_rows(res: dict, split: str) -> list[tuple[str, ...]]:
    """One row per model (two more for BatchNorm models): barriers and seconds."""
    ms = res["methods"]
    rb = ms.get("rebasin")
    w_s, det_s = ms["weights"]["seconds"], res["detect_seconds"]
    rb_s = rb.get("seconds") if rb else None
    times = (
        f"{w_s:.3f}",
        f"{det_s:.3f}",
        f"{rb_s:.3f}" if rb_s is not None else "",
        f"{rb_s / w_s:.1f}" if rb_s is not None else "",
        f"{rb_s / (w_s + det_s):.1f}" if rb_s is not None else "",
    )

    def on_split(m):
        return m[split]

    def bn_reset(m):
        return m["bn_reset"][split]

    naive = ms["naive"][split].barrier
    rows = [
        (
            res["name"],
            f"{naive:.3f}",
            *(cell(ms.get(k), on_split, naive) for k in ("weights", "activations", "rebasin")),
            *times,
        )
    ]
    if "rebasin + BN recomputed" in ms:
        m = ms["rebasin + BN recomputed"]
        rows.append(("  rebasin + BN recomputed", "=", "=", "=", cell(m, on_split, naive)))
    if "bn_reset" in ms["naive"]:
        naive = bn_reset(ms["naive"]).barrier
        rows.append(
            (
                "  BN reset per point",
                f"{naive:.3f}",
                *(cell(ms.get(k), bn_reset, naive) for k in ("weights", "activations", "rebasin")),
            )
        )
    return rows


def print_table(results: list[dict], split: str) -> None:
    head = (
        "model",
        "naive",
        "weights (x naive)",
        "activations (x naive)",
        "rebasin (x naive)",
        "wsym s",
        "detect s",
        "rebasin s",
        "rebasin/wsym",
        "rebasin/(detect+wsym)",
    )
    lines = [row for res in results for row in table_rows(res, split)]
    lines = [row + ("",) * (len(head) - len(row)) for row in lines]
    widths = [max(len(r[i]) for r in [head, *lines]) for i in range(len(head))]
    for r in [head, tuple("-" * w for w in widths), *lines]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def report(results: list[dict]) -> None:
    for split in ("train", "test"):
        print(f"\nLoss barrier on the {split} split ({STEPS} points; x naive = ratio to naive)")
        print_table(results, split)
    print(
        "\n* the aligned model B computes a different function (relative output change > 1e-3)."
        "\n= same as the row above. wsym s: wsym.align weights; activation matching times below."
        "\nrebasin/wsym: rebasin seconds over wsym.align seconds (> 1: wsym is faster);"
        "\nrebasin/(detect+wsym): like with like, both including their set-up on the models."
    )
    print("\nFinal models (seed 0 / seed 1): train accuracy, test accuracy, training seconds")
    for res in results:
        a, b = res["accuracies"]
        print(
            f"  {res['name']:<12} train {a['train_accuracy']:.3f} / {b['train_accuracy']:.3f}"
            f"   test {a['test_accuracy']:.3f} / {b['test_accuracy']:.3f}"
            f"   {a['train_seconds']:.1f} s / {b['train_seconds']:.1f} s"
            f"   ({res['parameters']} parameters, {res['groups']} groups)"
        )
    print(
        "\nPer method: alignment seconds, L2 distance to model A, relative output change of B,"
        "\ntrain loss of B, loss barrier train / test (BN reset per point: train / test)"
    )
    for res in results:
        for name, m in res["methods"].items():
            if "error" in m:
                print(f"  {res['name']:<12} {name:<24} failed: {m['error']}")
                continue
            bn = m.get("bn_reset")
            extra = f"   ({bn['train'].barrier:.3f} / {bn['test'].barrier:.3f})" if bn else ""
            print(
                f"  {res['name']:<12} {name:<24} {m['seconds']:6.3f} s  L2 {m['l2_to_a']:7.3f}"
                f"  change {m['output_change']:.0e}  B {m['train'].losses[-1]:.3f}"
                f"  barrier {m['train'].barrier:.3f} / {m['test'].barrier:.3f}{extra}"
            )


def to_json(results: list[dict], args) -> dict:
    out = []
    for res in results:
        methods = {}
        for name, m in res["methods"].items():
            entry = {k: v for k, v in m.items() if k not in ("sd", "train", "test", "bn_reset")}
            for split in ("train", "test"):
                if split in m:
                    entry[split] = curve_json(m[split])
            if "bn_reset" in m:
                entry["bn_reset"] = {s: curve_json(c) for s, c in m["bn_reset"].items()}
            methods[name] = entry
        out.append(
            {k: v for k, v in res.items() if k != "methods"}
            | {"methods": methods, "train_args": res["train_args"]}
        )
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "quick": args.quick,
        "repeats": args.repeats,
        "steps": STEPS,
        "seeds": list(SEEDS),
        "results": out,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results as JSON to this path")
    parser.add_argument("--quick", action="store_true", help="1 epoch per model (smoke run)")
    parser.add_argument("--repeats", type=int, default=None, help="timing repeats (3; quick 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: default)")
    parser.add_argument(
        "--only", nargs="+", default=None, help="run only these pairs (e.g. transformer mlp-512)"
    )
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = perf_counter()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, repeats {args.repeats}")
    wsym.detect(MLP(4, [4], 2), torch.randn(2, 4))  # warm up torch.export
    results = []
    for cfg in configs(args.quick):
        if args.only and cfg["name"] not in args.only:
            continue
        results.append(run_pair(cfg, args.repeats))
        print(f"  {cfg['name']} done at {perf_counter() - start:.0f} s", file=sys.stderr)
    report(results)
    print(f"\ntotal {perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(to_json(results, args), f, indent=1)


if __name__ == "__main__":
    main()
