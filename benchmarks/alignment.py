"""Alignment benchmark: loss barriers after wsym.align, against no alignment and ``rebasin``.

Run from the repository root (``rebasin`` must be installed; it is not a wsym
dependency)::

    .venv/bin/python benchmarks/alignment.py [--json PATH] [--quick] [--only NAME ...]
        [--orders 5] [--cache DIR] [--methods ALIGNER ...]

Pairs of models trained from different seeds (different initialization and
data order), trained once and cached under ``--cache`` (default
``.cache/alignment``, gitignored; ``torch.save`` state dicts read back with
``weights_only=True``): ``MLP(40, [w, w], 10)`` for w in 64, 256, 512 and
``CNN1d`` (BatchNorm) on mnist1d (SGD, lr 0.05, momentum 0.9, 30 epochs), the
Git Re-Basin-shaped ``MLP(40, [512, 512, 512], 10)`` on ``mnist1d-large``
(EPOCHS_LARGE epochs), a ``TinyTransformer`` on ``mnist1d-seq`` (Adam, lr 3e-3,
30 epochs) and a small ViT (2x2 patches of sklearn's 8x8 digits, class token,
two pre-LN blocks; Adam, 90 epochs). For each pair it moves model B onto model
A's basis with

* ``wsym``: ``wsym.align(..., "weights", model=, batches=)``, the default: its
  candidates (permutations matched and continuous groups fitted to A, alternately,
  from several starts) ranked by the loss along the path, the two lowest then
  refined by the path fit (``refine="auto"``), the lowest kept;
* ``wsym no refine``: the same with ``refine="none"`` (the previous default);
* ``wsym canonical``: ``continuous="canonical"`` (both canonicalized in their
  continuous groups, then matched);
* ``wsym biases matched``: ``biases="matched"`` (the previous default: every
  parameter in weight matching's pairing scores, see ``wsym.align.biases``);
* ``wsym activations``: ``wsym.align(..., "activations")`` on 4 train batches of 256;
* ``wsym act+weights``: ``wsym.align(..., "activations+weights")``: activation
  matching's permutations as the start of weight matching, which moves every class;
* ``wsym rotation``: ``"activations+weights"`` with ``residual="rotation"``: a pre-LN
  transformer's residual stream rotated onto A's (norm gains folded, the rotation
  from the activations at every stream site; transformer pairs only, the others
  have no such stream);
* ``wsym rotation act``: ``"activations"`` with ``residual="rotation"``: the same
  rotation, the heads and MLP units then held at activation matching's
  permutations (only the continuous groups fitted to A after it);
* ``wsym rotation path``: ``rotation act``, then ``refine="path"``: the continuous groups
  (the stream rotation, each head's GL elements, the MLP units' scales) fitted by
  gradient descent to the training loss along the path from A (cross-entropy on the
  same 4 train batches of 256, 100 steps; ``t`` drawn per step by the visiting order's
  seed);
* ``wsym perm only``: wsym's weight matching alone (permutations and signs, as
  rebasin does; no continuous group fitted);
* ``rebasin``: ``rebasin.PermutationCoordinateDescent`` (PyPI ``rebasin``) on a copy,

each over ``--orders`` visiting orders of coordinate descent (wsym ``seed=``,
rebasin ``torch.manual_seed``; activations one order), and reports the loss
barrier (largest excess of the loss over the straight line between the
endpoint losses, 11 points) on the train and the test split, median and range
over the orders, as is and with REPAIR at every point (``wsym.interpolate(...,
repair=True)``, statistics on 4 train batches of 256, for ``wsym``, ``wsym
biases matched``, ``wsym act+weights`` and rebasin; for the BatchNorm CNN
this is the BatchNorm statistics reset). Times are CPU seconds
(``time.process_time``, one torch thread), median over the orders: wsym's is
``wsym.align`` with the spec given, rebasin's its whole use on the pair
(tracing and coordinate descent). rebasin permutes BatchNorm weights but not
running statistics and breaks attention: ``*`` marks an aligned model B that
computes a different function (relative output change > 1e-3). ``--methods``
runs only the aligners named (the others show ``n/a``).
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
from wsym.align.batchnorm import reset_batchnorm_stats
from wsym.align.choice import weight_distance
from wsym.align.interpolate import Curve
from wsym.align.matching import weight_matching
from wsym.group.elements import GroupElement, act
from wsym.io.datasets import load
from wsym.models.evaluate import evaluate
from wsym.models.networks import MLP, Block, CNN1d, TinyTransformer
from wsym.models.train import train

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
    """rebasin's permuted copy of ``model_b`` (state dict) and the median CPU seconds."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from rebasin import PermutationCoordinateDescent

    def run():
        torch.manual_seed(seed)  # rebasin visits permutations in torch.randperm order
        net = copy.deepcopy(model_b)
        start = time.process_time()
        pcd = PermutationCoordinateDescent(model_a, net, x)
        pcd.rebasin(max_iterations=100)
        return net, time.process_time() - start

    times, net = [], None
    for _ in range(repeats):
        net, seconds = run()
        times.append(seconds)
    return {k: v.detach().clone() for k, v in net.state_dict().items()}, statistics.median(times)


def permutation_only(sd_a: dict, sd_b: dict, spec, seed: int = 0) -> dict:
    """wsym's weight matching on the raw weights (no continuous group moves)."""
    ref, other = (
        {k: v.double() if v.is_floating_point() else v for k, v in sd.items()}
        for sd in (sd_a, sd_b)
    )
    moved = act(spec, GroupElement(tuple(weight_matching(spec, ref, other, seed=seed))), other)
    return {k: v.to(sd_b[k].dtype) for k, v in moved.items()}


def output_change(model, sd_b: dict, sd_moved: dict, x) -> float:
    """Largest output change from ``sd_b`` to ``sd_moved``, relative to the largest output.

    Both run in float64 (float32 weights cast exactly): what is measured is whether the
    stored aligned weights compute B's function, not the float32 forward pass's own
    rounding, which differs between two orderings of the same units (~1e-6 on the ViT).
    """
    outs = []
    for sd in (sd_b, sd_moved):
        net = copy.deepcopy(model).double()
        net.load_state_dict(sd)
        net.eval()
        with torch.no_grad():
            outs.append(net(x.double() if x.is_floating_point() else x))
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


def has_layernorm(model) -> bool:
    """Whether ``model`` holds a LayerNorm (a candidate pre-LN residual stream)."""
    return any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())


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


ORDERS = 5  # visiting orders of coordinate descent per aligner (wsym seed=, rebasin torch seed)
ALIGNERS = {
    "wsym": {"method": "weights", "continuous": "auto"},  # the default: chosen by the path loss
    "wsym no refine": {"method": "weights", "continuous": "auto", "refine": "none"},  # previous
    "wsym reference": {"method": "weights", "continuous": "reference"},  # the fast one
    "wsym no data": {"method": "weights", "continuous": "auto", "data": False},  # chosen by D
    "wsym canonical": {"method": "weights", "continuous": "canonical"},
    "wsym biases matched": {"method": "weights", "continuous": "reference", "biases": "matched"},
    "wsym activations": {"method": "activations", "continuous": "reference"},
    "wsym act+weights": {"method": "activations+weights", "continuous": "reference"},
    "wsym rotation": {
        "method": "activations+weights",
        "continuous": "reference",
        "residual": "rotation",
    },
    "wsym rotation act": {
        "method": "activations",
        "continuous": "reference",
        "residual": "rotation",
    },
    "wsym rotation path": {
        "method": "activations",
        "continuous": "reference",
        "residual": "rotation",
        "refine": "path",
    },
    "wsym perm only": None,  # weight matching alone: permutations and signs, no continuous fit
}
REPAIRED = (
    "wsym",
    "wsym no refine",
    "wsym reference",
    "wsym no data",
    "wsym biases matched",
    "wsym act+weights",
    "wsym rotation",
    "wsym rotation act",
    "wsym rotation path",
)  # aligners whose paths are also measured with REPAIR


def run_pair(cfg: dict, orders: int, cache: Path, only_methods=None) -> dict:
    """Align B onto A every way, over ``orders`` visiting orders, and measure the paths.

    ``only_methods``: the aligners to run (all when None); the others get no runs.
    """
    model_a, model_b, data, accuracies = trained_pair(cfg, cache)
    sd_a, sd_b = (
        {k: v.detach().clone() for k, v in m.state_dict().items()} for m in (model_a, model_b)
    )
    x_example = data.x_train[:64]
    start = time.process_time()
    spec = wsym.detect(model_a, x_example)
    detect_s = time.process_time() - start
    splits = {"train": list(data.batches("train", 1000)), "test": list(data.batches("test", 1000))}
    stat_batches = list(data.batches("train", 256, seed=0, shuffle=True))[:4]
    x_check = data.x_test[:256]

    def measure(sd, seconds, repair=True):
        m = {
            "seconds": seconds,
            "objective": weight_distance(spec, sd_a, sd),
            "output_change": output_change(model_a, sd_b, sd, x_check),
            "l2_to_a": l2(sd_a, sd),
        }
        for split, batches in splits.items():
            m[split] = wsym.interpolate(model_a, sd_a, sd, batches, F.cross_entropy, STEPS)
            if repair:
                m[f"{split} repair"] = wsym.interpolate(
                    model_a,
                    sd_a,
                    sd,
                    batches,
                    F.cross_entropy,
                    STEPS,
                    repair=True,
                    repair_batches=stat_batches,
                )
        return m

    methods: dict[str, list[dict]] = {"naive": [measure(sd_b, 0.0)]}
    for name, kw in ALIGNERS.items():
        runs = []
        if only_methods is not None and name not in only_methods:
            methods[name] = runs
            continue
        for seed in range(orders if name != "wsym activations" else 1):
            start = time.process_time()
            if kw is None:
                sd = permutation_only(sd_a, sd_b, spec, seed)
            elif "residual" in kw and not has_layernorm(model_a):
                break  # no pre-LN residual stream to rotate
            else:
                data = kw.get("data", True)
                sd, chosen = wsym.align(
                    sd_a,
                    sd_b,
                    spec,
                    kw["method"],
                    continuous=kw["continuous"],
                    residual=kw.get("residual", "permutation"),
                    biases=kw.get("biases", "auto"),
                    refine=kw.get("refine", "auto"),
                    model=model_a if data else None,
                    batches=stat_batches if data else None,
                    seed=seed,
                    with_report=True,
                )
            elapsed = time.process_time() - start
            runs.append(measure(sd, elapsed, repair=name in REPAIRED))
            if kw is not None:
                runs[-1]["chosen"] = chosen.chosen
        methods[name] = runs
    runs = []
    for seed in range(orders if only_methods is None or "rebasin" in only_methods else 0):
        try:
            sd, seconds = rebasin_align(model_a, model_b, x_example, 1, seed=seed)
        except Exception as err:  # noqa: BLE001 - reported in the table
            text = str(err).strip().splitlines()[0] if str(err).strip() else ""
            runs = [{"error": f"{type(err).__name__}: {text}"[:300]}]
            break
        runs.append(measure(sd, seconds))
    methods["rebasin"] = runs
    return {
        "name": cfg["name"],
        "data": cfg["data"],
        "train_args": cfg["train"],
        "parameters": sum(p.numel() for p in model_a.parameters()),
        "groups": len(spec.groups),
        "batchnorm": has_batchnorm(model_a),
        "detect_seconds": detect_s,
        "accuracies": accuracies,
        "methods": methods,
    }


def summary(runs: list[dict], key: str) -> tuple[float, float, float] | None:
    """(median, least, largest) barrier over the runs, None where there is none."""
    values = [r[key].barrier for r in runs if key in r]
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def cell(runs: list[dict], key: str, naive: float, stars: bool = True) -> str:
    """Median barrier (ratio to naive) [least-largest], ``*`` where the function changed.

    ``stars=False``: no ``*`` (BatchNorm statistics reset at every point, so running
    statistics left unpermuted do not change the function measured).
    """
    if not runs:
        return "n/a"
    if "error" in runs[0]:
        return "error (below)"
    med, lo, hi = summary(runs, key)
    star = " *" if stars and max(r["output_change"] for r in runs) > 1e-3 else ""
    spread = f" [{lo:.3f}-{hi:.3f}]" if len(runs) > 1 else ""
    return f"{med:.3f} ({med / naive:.2f}x){spread}{star}"


def seconds(runs: list[dict]) -> float | None:
    values = [r["seconds"] for r in runs if "seconds" in r]
    return statistics.median(values) if values else None


COLUMNS = (
    "wsym",
    "wsym no refine",
    "wsym reference",
    "wsym no data",
    "wsym canonical",
    "wsym biases matched",
    "wsym activations",
    "wsym act+weights",
    "wsym rotation",
    "wsym rotation act",
    "wsym rotation path",
    "wsym perm only",
    "rebasin",
)


def table_rows(res: dict, split: str) -> list[tuple[str, ...]]:
    """Per pair: as is, then with REPAIR (BatchNorm: statistics reset) at every point."""
    ms = res["methods"]
    naive = ms["naive"][0][split].barrier
    w_s, aw_s, rb_s = seconds(ms["wsym"]), seconds(ms["wsym act+weights"]), seconds(ms["rebasin"])
    nr_s, rot_s = seconds(ms["wsym no refine"]), seconds(ms["wsym rotation"])
    path_s = seconds(ms["wsym rotation path"])
    times = (
        *(f"{s:.3f}" if s is not None else "" for s in (w_s, nr_s, aw_s, rot_s, path_s, rb_s)),
        f"{rb_s / w_s:.2f}" if rb_s is not None and w_s else "",
    )
    rows = [(res["name"], f"{naive:.3f}", *(cell(ms[k], split, naive) for k in COLUMNS), *times)]
    key = f"{split} repair"
    rebasin_failed = bool(ms["rebasin"]) and "error" in ms["rebasin"][0]
    naive_r = ms["naive"][0][key].barrier
    label = "  BN statistics reset" if res["batchnorm"] else "  + REPAIR"
    stars = not res["batchnorm"]  # statistics reset: unpermuted running statistics do not count
    rows.append(
        (
            label,
            f"{naive_r:.3f}",
            cell(ms["wsym"], key, naive_r, stars),
            cell(ms["wsym no refine"], key, naive_r, stars),
            cell(ms["wsym reference"], key, naive_r, stars),
            cell(ms["wsym no data"], key, naive_r, stars),
            "",
            cell(ms["wsym biases matched"], key, naive_r),
            "",
            cell(ms["wsym act+weights"], key, naive_r),
            cell(ms["wsym rotation"], key, naive_r),
            cell(ms["wsym rotation act"], key, naive_r),
            cell(ms["wsym rotation path"], key, naive_r),
            "",
            "" if rebasin_failed else cell(ms["rebasin"], key, naive_r, stars),
        )
    )
    return rows


def print_table(results: list[dict], split: str) -> None:
    head = (
        "pair",
        "naive",
        *COLUMNS,
        "wsym s",
        "no refine s",
        "a+w s",
        "rot s",
        "path s",
        "rebasin s",
        "rebasin/wsym",
    )
    lines = [row for res in results for row in table_rows(res, split)]
    lines = [row + ("",) * (len(head) - len(row)) for row in lines]
    widths = [max(len(r[i]) for r in [head, *lines]) for i in range(len(head))]
    for r in [head, tuple("-" * w for w in widths), *lines]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def report(results: list[dict], orders: int) -> None:
    for split in ("train", "test"):
        print(
            f"\nLoss barrier on the {split} split ({STEPS} points): median over {orders} visiting"
            " orders (ratio to naive) [least-largest]"
        )
        print_table(results, split)
    print(
        "\n* the aligned model B computes a different function (relative output change > 1e-3)."
        "\nwsym: wsym.align(method='weights', model=, batches=), the default continuous='auto',"
        " refine='auto' (the candidate with the lowest loss along the path, the two lowest"
        " refined by the path fit); wsym no refine: refine='none' (the previous default);"
        " wsym reference: continuous='reference'; wsym no data: 'auto' without data"
        " (lowest weight-matching objective);"
        " wsym canonical: continuous='canonical';"
        "\nwsym biases matched: biases='matched' (the previous default: every parameter in the"
        " matching's scores);"
        "\nwsym activations: one order; wsym act+weights: method='activations+weights'"
        " (activation matching's permutations as the start of weight matching);"
        "\nwsym rotation: act+weights with residual='rotation' (pre-LN residual stream rotated);"
        " wsym rotation act: method='activations' with residual='rotation' (heads and MLP"
        "\nunits held at activation matching's permutations); wsym rotation path: rotation act,"
        " then refine='path'\n(continuous groups fitted to the train loss along the path)."
        "\nREPAIR / BN statistics reset at every point of the path on 4 train batches of 256."
        "\nwsym s, no refine s, a+w s, rot s, path s, rebasin s: median CPU seconds of one"
        " alignment (spec given; rebasin traces the pair itself); wsym.detect: see below."
    )
    print("\nFinal models (seed 0 / seed 1): train accuracy, test accuracy, training CPU seconds")
    for res in results:
        a, b = res["accuracies"]
        print(
            f"  {res['name']:<12} train {a['train_accuracy']:.3f} / {b['train_accuracy']:.3f}"
            f"   test {a['test_accuracy']:.3f} / {b['test_accuracy']:.3f}"
            f"   {a['train_seconds']:.1f} s / {b['train_seconds']:.1f} s"
            f"   ({res['parameters']} parameters, {res['groups']} groups,"
            f" detect {res['detect_seconds']:.2f} s)"
        )
    print(
        "\nWeight-matching objective sum_k ||B_k - A_k||^2 (parameters) after alignment:"
        " median [least-largest] over the orders"
    )
    for res in results:
        parts = []
        for name, runs in res["methods"].items():
            if runs and "error" not in runs[0]:
                values = [r["objective"] for r in runs]
                spread = f" [{min(values):.1f}-{max(values):.1f}]" if len(values) > 1 else ""
                parts.append(f"{name} {statistics.median(values):.1f}{spread}")
        print(f"  {res['name']:<12} " + ", ".join(parts))
    print("\ncontinuous='auto': the chosen candidate per order (with the batches; without data)")
    for res in results:
        parts = [
            f"{name}: " + ", ".join(r.get("chosen", "?") for r in res["methods"][name])
            for name in ("wsym", "wsym no refine", "wsym no data")
            if res["methods"].get(name)
        ]
        print(f"  {res['name']:<12} " + "; ".join(parts))
    print("\nLargest relative output change of B over the orders (function kept: < 1e-6)")
    for res in results:
        parts = []
        for name, runs in res["methods"].items():
            if name == "naive" or not runs:
                continue
            if "error" in runs[0]:
                parts.append(f"{name} failed: {runs[0]['error']}")
            else:
                parts.append(f"{name} {max(r['output_change'] for r in runs):.0e}")
        print(f"  {res['name']:<12} " + ", ".join(parts))


def to_json(results: list[dict], args) -> dict:
    out = []
    for res in results:
        methods = {}
        for name, runs in res["methods"].items():
            entries = []
            for m in runs:
                entry = {}
                for k, v in m.items():
                    entry[k] = curve_json(v) if isinstance(v, Curve) else v
                entries.append(entry)
            methods[name] = entries
        out.append({k: v for k, v in res.items() if k != "methods"} | {"methods": methods})
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "quick": args.quick,
        "orders": args.orders,
        "steps": STEPS,
        "seeds": list(SEEDS),
        "results": out,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results as JSON to this path")
    parser.add_argument("--quick", action="store_true", help="1 epoch per model (smoke run)")
    parser.add_argument("--orders", type=int, default=ORDERS, help="visiting orders (5)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: default)")
    parser.add_argument("--cache", default=".cache/alignment", help="trained pairs (gitignored)")
    parser.add_argument(
        "--only", nargs="+", default=None, help="run only these pairs (e.g. transformer mlp-512)"
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        choices=[*ALIGNERS, "rebasin"],
        help="run only these aligners (e.g. wsym 'wsym rotation path' rebasin); others: n/a",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    start = perf_counter()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, orders {args.orders}")
    wsym.detect(MLP(4, [4], 2), torch.randn(2, 4))  # warm up torch.export
    results = []
    for cfg in configs(args.quick):
        if args.only and cfg["name"] not in args.only:
            continue
        results.append(run_pair(cfg, args.orders, Path(args.cache), args.methods))
        print(f"  {cfg['name']} done at {perf_counter() - start:.0f} s", file=sys.stderr)
    report(results, args.orders)
    print(f"\ntotal {perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(to_json(results, args), f, indent=1)


if __name__ == "__main__":
    main()
