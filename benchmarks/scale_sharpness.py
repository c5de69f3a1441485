"""Whole ``wsym.sharpness`` calls at real sizes: adaptive against geodesic-inv / -mix.

For ViT-S/16 and ViT-B/16 (timm, random init, 2 images of 224x224) and BERT-base
(Hugging Face ``BertConfig()`` defaults, a 2-label classification head, 2 sequences of
128 tokens): the seconds of one ``wsym.sharpness`` call (setup included: balancing,
factorizations, the Gram solve's complement) at the default 10 ascent steps, in
float32 with micro-batches of one sample, and the peak RSS of the process that made
it. Every measure runs in a fresh subprocess (``resource.getrusage`` of the child), so
one measure's memory never counts against another; the spec is detected once per
model in its own subprocess and read from a JSON file, so detection's memory is in
neither. One thread. Prints one row per (model, measure) as it finishes and the
ratios to adaptive; ``--out`` also writes the rows as JSON lines.

Run (about 25 minutes on 2 cores; hold the big-memory lock on a shared machine):
    flock /tmp/wsym-bigmem.lock nice -n 10 env PYTHONPATH=. python benchmarks/scale_sharpness.py
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

MODELS = ("vit_s16", "vit_b16", "bert_base")
MEASURES = ("adaptive", "geodesic-inv", "geodesic-mix")


def build(name: str):
    """``(model, [(inputs, targets)], loss_fn)`` of ``name``, random weights (seed 0)."""
    import torch

    torch.manual_seed(0)
    if name.startswith("vit"):
        import timm

        arch = {"vit_s16": "vit_small_patch16_224", "vit_b16": "vit_base_patch16_224"}[name]
        model = timm.create_model(arch, pretrained=False).eval()
        x, y = torch.randn(2, 3, 224, 224), torch.randint(0, 1000, (2,))
        return model, [(x, y)], torch.nn.functional.cross_entropy
    from transformers import BertConfig, BertForSequenceClassification

    model = BertForSequenceClassification(BertConfig(num_labels=2)).eval()
    x = {"input_ids": torch.randint(0, 30522, (2, 128))}
    y = torch.randint(0, 2, (2,))

    def loss(out, target):
        return torch.nn.functional.cross_entropy(out.logits, target)

    return model, [(x, y)], loss


def gib() -> float:
    """Peak RSS of this process, GiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def child_detect(name: str, path: str) -> None:
    import torch

    import wsym

    torch.set_num_threads(1)
    model, batches, _ = build(name)
    spec = wsym.detect(model, batches[0][0])
    with open(path, "w") as f:
        f.write(spec.to_json())


def child_measure(name: str, measure: str, spec_path: str, steps: int) -> None:
    import torch

    import wsym
    from wsym.group.spec import SymmetrySpec

    torch.set_num_threads(1)
    model, batches, loss = build(name)
    with open(spec_path) as f:
        spec = SymmetrySpec.from_json(f.read())
    params = sum(p.numel() for p in model.parameters())
    before = gib()
    start = time.perf_counter()
    value = wsym.sharpness(
        model, batches, loss, spec=spec, measure=measure, steps=steps,
        dtype=torch.float32, micro_batch=1,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    row = {"model": name, "params": params, "measure": measure, "steps": steps, "value": value,
           "seconds": seconds, "peak_rss_gib": gib(), "rss_before_gib": before}  # fmt: skip
    print(json.dumps(row), flush=True)


def run(args: list[str]) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode:
        raise RuntimeError(f"{' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return out.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", help="also write the rows here (JSON lines)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        return child_detect(*rest) if kind == "detect" else child_measure(*rest[:3], args.steps)
    print("whole wsym.sharpness call, float32, micro-batches of 1, one thread, "
          f"{args.steps} steps", flush=True)  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            spec_path = os.path.join(tmp, f"{name}.json")
            run(["--child", "detect", name, spec_path])
            mine = {}
            for measure in MEASURES:
                line = run(["--steps", str(args.steps), "--child", "measure", name, measure,
                            spec_path]).strip().splitlines()[-1]  # fmt: skip
                row = json.loads(line)
                mine[measure] = row
                base = mine["adaptive"]
                row["time_ratio"] = row["seconds"] / base["seconds"]
                row["rss_ratio"] = row["peak_rss_gib"] / base["peak_rss_gib"]
                rows.append(row)
                print(f"{name:10s} {row['params'] / 1e6:6.1f}M {measure:13s} "
                      f"{row['seconds']:8.1f} s  peak RSS {row['peak_rss_gib']:6.2f} GiB  "
                      f"x{row['time_ratio']:.2f} time  x{row['rss_ratio']:.2f} memory  "
                      f"(value {row['value']:.6g})", flush=True)  # fmt: skip
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
