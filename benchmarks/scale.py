"""Benchmark: every use of wsym along a size ladder per model family: seconds and peak RSS.

Families (random weights from their configs, nothing downloaded):

* ``bert``: Hugging Face ``BertModel``, tiny (4.4M) to large (335M), 2 sequences of 16 tokens;
* ``vit``: timm ViT-Ti/16, ViT-S/16, ViT-B/16, 2 images of 224x224;
* ``resnet``: torchvision ResNet-18/50/101, 2 images of 224x224;
* ``llama``: Hugging Face ``LlamaForCausalLM`` shaped 50M to TinyLlama's 1.1B (GQA), 1 sequence of 8
  tokens (built on ``meta`` and filled tensor by tensor, as ``benchmarks/scale_detect.py``).

Uses, each in a fresh subprocess (its ``ru_maxrss`` is the use's peak RSS) with one thread:

* ``detect``: ``wsym.detect(model, inputs)``;
* ``canon``: ``wsym.canonicalize(sd, spec, dtype=float32)``;
* ``align``: ``wsym.align(sd_a, sd_b, spec, dtype=float32)``, two independent inits;
* ``merge``: ``wsym.merge([sd_a, sd_b], spec, dtype=float32)``;
* ``sharpness``: one ``wsym.sharpness`` call (default measure, geodesic-mix, setup included),
  ``steps=1``, float32, micro-batches of one sample;
* ``features``: what a meta-network reads of a checkpoint of any architecture: the invariant
  form (``wsym.metanet.invariant.invariant_form``) and the statistics of every tensor.

The spec of each model is detected once in its own subprocess and read from JSON by the
other uses. Each row: parameters, float32 size, seconds, peak RSS, and the memory
multiple ``(peak RSS - interpreter RSS) / float32 size``, where the interpreter RSS is the
child's after its imports and before it builds anything (the memory target of the
project is ``<= 3x`` the float32 checkpoint plus one micro-batch's activations). Per
family and use, the fitted log-log slope of seconds in parameter count.

Run from the repository root (about 70 minutes on 2 cores; writes the rows as JSON lines
and the table as Markdown)::

    flock /tmp/wsym-bigmem.lock env PYTHONPATH=. .venv/bin/python benchmarks/scale.py \\
        --out benchmarks/scale_results.jsonl --table benchmarks/scale_results.md

``--families`` / ``--sizes`` / ``--uses`` pick a part of the ladder; ``--timeout`` bounds
every use (a row then says ``timeout``); ``--rows FILE --table T`` writes the table of rows
measured before (the last row of each model and use: a part of the ladder measured again
after a change replaces its rows).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time

LADDER = {
    "bert": ("bert-tiny", "bert-mini", "bert-small", "bert-medium", "bert-base", "bert-large"),
    "vit": ("vit-ti16", "vit-s16", "vit-b16"),
    "resnet": ("resnet18", "resnet50", "resnet101"),
    "llama": ("llama-50m", "llama-160m", "llama-450m", "llama-1.1b"),
}
USES = ("detect", "canon", "align", "merge", "sharpness", "features")

BERT = {  # (hidden, layers, heads), intermediate 4 x hidden
    "bert-tiny": (128, 2, 2),
    "bert-mini": (256, 4, 4),
    "bert-small": (512, 4, 8),
    "bert-medium": (512, 8, 8),
    "bert-base": (768, 12, 12),
    "bert-large": (1024, 24, 16),
}
LLAMA = {  # (hidden, intermediate, layers, heads, key-value heads), vocabulary 32000
    "llama-50m": (512, 1376, 8, 8, 4),
    "llama-160m": (768, 2048, 12, 12, 4),
    "llama-450m": (1280, 3456, 16, 16, 4),
    "llama-1.1b": (2048, 5632, 22, 32, 4),  # TinyLlama-1.1B
}
TIMM = {"vit-ti16": "vit_tiny_patch16_224", "vit-s16": "vit_small_patch16_224",
        "vit-b16": "vit_base_patch16_224"}  # fmt: skip


def _llama(name: str, seed: int):
    import torch
    import transformers

    hidden, inter, layers, heads, kv = LLAMA[name]
    cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=inter,
                                   num_hidden_layers=layers, num_attention_heads=heads,
                                   num_key_value_heads=kv, vocab_size=32000)  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        for kind in ("_parameters", "_buffers"):
            table = getattr(module, kind)
            for key, t in list(table.items()):
                if t is None or t.device.type != "meta":
                    continue
                real = torch.empty(t.shape, dtype=t.dtype)
                if t.ndim == 1 and t.is_floating_point():
                    real.fill_(1.0)  # norm weights
                elif t.is_floating_point():
                    real.normal_(0.0, 0.02, generator=gen)
                table[key] = torch.nn.Parameter(real) if kind == "_parameters" else real
    for module in model.modules():  # rotary tables are computed, not stored
        if hasattr(module, "inv_freq") and hasattr(module, "rope_init_fn"):
            inv_freq, scaling = module.rope_init_fn(module.config, torch.device("cpu"))
            module.register_buffer("inv_freq", inv_freq, persistent=False)
            module.original_inv_freq = inv_freq
            module.attention_scaling = scaling
    model.tie_weights()
    return model


def build(name: str, seed: int = 0):
    """``(model, batches, loss_fn)`` of ``name``: random weights of ``seed``, eval mode."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(100)
    if name in BERT:
        from transformers import BertConfig, BertModel

        hidden, layers, heads = BERT[name]
        cfg = BertConfig(hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, intermediate_size=4 * hidden)  # fmt: skip
        model = BertModel(cfg)
        x = {"input_ids": torch.randint(0, 30522, (2, 16), generator=gen)}
        y = torch.randn(2, hidden, generator=gen)

        def loss(out, target):  # regression of the pooled output
            return F.mse_loss(out.pooler_output, target)

        return model.eval(), [(x, y)], loss
    if name in LLAMA:
        model = _llama(name, seed)
        ids = torch.randint(0, 32000, (1, 8), generator=gen)

        def loss(out, target):  # next-token prediction
            return F.cross_entropy(out.logits[:, :-1].flatten(0, 1), target[:, 1:].flatten())

        return model.eval(), [(ids, ids)], loss
    x = torch.randn(2, 3, 224, 224, generator=gen)
    y = torch.randint(0, 1000, (2,), generator=gen)
    if name in TIMM:
        import timm

        model = timm.create_model(TIMM[name], pretrained=False)
    else:
        import torchvision

        model = getattr(torchvision.models, name)(weights=None)
    return model.eval(), [(x, y)], F.cross_entropy


def _rss() -> float:
    with open("/proc/self/status") as f:
        return int(next(x for x in f if x.startswith("VmRSS")).split()[1]) * 1024


def _peak() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(name: str, use: str, spec_path: str) -> None:
    """Run one use of ``name`` and print its row as JSON (the last line of stdout)."""
    import torch

    import wsym
    from wsym.group.spec import SymmetrySpec

    torch.set_num_threads(1)
    __import__("timm" if name in TIMM else "transformers" if name in BERT or name in LLAMA
               else "torchvision")  # fmt: skip
    interpreter = _rss()  # imports done: what is left is the use's
    model, batches, loss = build(name)
    params = sum(p.numel() for p in model.parameters())
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    if use == "detect":
        start = time.perf_counter()
        spec = wsym.detect(model, batches[0][0])
        seconds = time.perf_counter() - start
        with open(spec_path, "w") as f:
            f.write(spec.to_json())
    else:
        with open(spec_path) as f:
            spec = SymmetrySpec.from_json(f.read())
        other = None
        if use in ("align", "merge"):
            other_model = build(name, seed=1)[0]
            other = {k: v.detach() for k, v in other_model.state_dict().items()}
            del other_model
        start = time.perf_counter()
        if use == "canon":
            wsym.canonicalize(sd, spec, dtype=torch.float32)
        elif use == "align":
            wsym.align(sd, other, spec, dtype=torch.float32)
        elif use == "merge":
            wsym.merge([sd, other], spec, dtype=torch.float32)
        elif use == "sharpness":
            wsym.sharpness(model, batches, loss, spec=spec, steps=1, dtype=torch.float32,
                           micro_batch=1)  # fmt: skip
        elif use == "features":
            from wsym.metanet.invariant import invariant_form
            from wsym.metanet.statistics import tensor_statistics

            form = invariant_form(sd, spec)
            [tensor_statistics(v) for v in form.values() if v.is_floating_point()]
        else:
            raise SystemExit(f"unknown use {use}")
        seconds = time.perf_counter() - start
    peak = _peak()
    float32 = 4 * params
    print(json.dumps({
        "model": name, "use": use, "params": params, "float32_gib": float32 / 2**30,
        "seconds": seconds, "peak_rss_gib": peak / 2**30,
        "memory_multiple": (peak - interpreter) / float32, "groups": len(spec.groups),
    }), flush=True)  # fmt: skip


def run(name: str, use: str, spec_path: str, timeout: float) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    cmd = [sys.executable, __file__, "--child", name, use, spec_path]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"model": name, "use": use, "status": f"timeout ({timeout:.0f} s)"}
    if out.returncode:
        tail = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"model": name, "use": use, "status": f"failed: {tail[:200]}"}
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "status": "ok"}


def slope(rows: list[dict]) -> float | None:
    """Least-squares slope of log seconds against log parameters (None under 2 points)."""
    pts = [(math.log(r["params"]), math.log(r["seconds"])) for r in rows if r["status"] == "ok"]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den


def table(rows: list[dict], uses: list[str]) -> str:
    """Markdown: one row per model (seconds / memory multiple per use), one slope row per family."""
    head = "| model | parameters | float32 GiB | " + " | ".join(uses) + " |"
    lines = [head, "|" + "---|" * (3 + len(uses))]
    for family, names in LADDER.items():
        mine = [r for r in rows if r["model"] in names]
        if not mine:
            continue
        for name in names:
            cells = {r["use"]: r for r in mine if r["model"] == name}
            if not cells:
                continue
            ok = next((r for r in cells.values() if r["status"] == "ok"), None)
            params = f"{ok['params'] / 1e6:.1f}M" if ok else "?"
            size = f"{ok['float32_gib']:.2f}" if ok else "?"
            out = []
            for use in uses:
                r = cells.get(use)
                if r is None:
                    out.append("")
                elif r["status"] != "ok":
                    out.append(r["status"].split(":")[0])
                else:
                    out.append(f"{r['seconds']:.1f} s, {r['peak_rss_gib']:.2f} GiB "
                               f"({r['memory_multiple']:.1f}x)")  # fmt: skip
            lines.append(f"| {name} | {params} | {size} | " + " | ".join(out) + " |")
        fits = [slope([r for r in mine if r["use"] == use]) for use in uses]
        cells = " | ".join("" if s is None else f"{s:.2f}" for s in fits)
        lines.append(f"| {family}: slope | | | {cells} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(LADDER), choices=list(LADDER))
    parser.add_argument("--sizes", nargs="+", help="only these models (default: every size)")
    parser.add_argument("--uses", nargs="+", default=list(USES), choices=USES)
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per use")
    parser.add_argument("--out", help="append the rows here (JSON lines)")
    parser.add_argument("--table", help="write the Markdown table here")
    parser.add_argument("--rows", help="measure nothing: the table of these JSON lines "
                        "(the last row of each model and use)")  # fmt: skip
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child)
    uses = [u for u in USES if u in args.uses]
    if args.rows:
        with open(args.rows) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        latest = {(r["model"], r["use"]): r for r in rows}
        return write_table(list(latest.values()), uses, args.table)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families:
            for name in LADDER[family]:
                if args.sizes and name not in args.sizes:
                    continue
                spec_path = os.path.join(tmp, f"{name}.json")
                for use in ["detect"] + [u for u in uses if u != "detect"]:
                    row = run(name, use, spec_path, args.timeout)
                    if use == "detect" and row["status"] != "ok":
                        rows.append(row)
                        break
                    if use in uses:
                        rows.append(row)
                    print(json.dumps(row), flush=True)
                    if args.out and use in uses:
                        with open(args.out, "a") as f:
                            f.write(json.dumps(row) + "\n")
    write_table(rows, uses, args.table)


def write_table(rows: list[dict], uses: list[str], path: str | None) -> None:
    text = table(rows, uses)
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
