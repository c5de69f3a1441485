"""Time one worst-case ascent step of ``wsym.sharpness`` per measure, on two models.

Goal: a geodesic worst-case ascent step costs at most 1.5x an adaptive step on the
same model and batch. One step is a loss and its gradient at the perturbed point
(through the measure's ``point`` map), the Riemannian gradient in the measure's
metric, and the projected momentum update (``wsym.sharpness.worst_case``).

``wsym.sharpness`` exposes no single step, so each measure is timed as
``sharpness(..., steps=11)`` minus ``sharpness(..., steps=1)``, divided by 10: the
per-call overhead (float64 copy, ``Quotient`` construction, the initial gradient at
``xi = 0``) cancels. The spec is detected once per model and passed in, so detection
is not timed. Median of ``--repeats`` interleaved calls (``time.perf_counter``) after
warm-up; all measures in one run on the same model and batch.

Models: ``wsym.reference.TinyTransformer()`` (default config) on a float input
(64, 10, 4) with random class targets and cross-entropy, and a small Hugging Face
``BertModel`` (hidden 64, 2 layers, 4 heads, intermediate 128, vocab 256) on
``{"input_ids": (8, 16)}`` and ``(32, 64)`` (dict inputs), with a cross-entropy on
the first 10 features of the pooled output against random class targets. The
geometry costs the same at every batch size (it works on the parameters) while
the forward and backward passes grow with the batch, so the tiny 8x16 batch is
the hardest case for the ratio.

Threads: one by default (``--threads``). These models are tiny, so intra-op
parallelism only adds synchronization to each small op; on a loaded machine the
default thread pool made every op (and the geodesic steps, with more small ops,
most) many times slower and the ratios meaningless.

Clock: wall time by default; ``--clock cpu`` times this thread's CPU time
(``time.thread_time``), which other processes on a shared machine disturb far
less than the wall clock (they still share caches and memory bandwidth).

Run:
    .venv/bin/python benchmarks/sharpness_speed.py [--repeats 10] [--threads 1] [--clock cpu]
"""

import argparse
import statistics
import time
import warnings

import torch
from torch import nn

import wsym
from wsym.quotient import Quotient
from wsym.reference import TinyTransformer

MEASURES = ("adaptive", "geodesic-mix", "geodesic-inv")
GOAL = 1.5
FEW, MANY = 1, 11


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def median_times(fns, repeats, clock):
    """Median seconds of each function; calls are interleaved so load hits all alike."""
    for fn in fns:  # warm-up
        fn()
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times, strict=True):
            start = clock()
            fn()
            ts.append(clock() - start)
    return [statistics.median(ts) for ts in times]


def step_times(model, batches, loss, repeats, clock):
    """Seconds per ascent step of each measure: (t(steps=11) - t(steps=1)) / 10."""
    spec = wsym.detect(model, batches[0][0])
    params = {n: p.detach().double() for n, p in model.named_parameters()}
    blocks = len(Quotient(spec, params).blocks)  # 0 would make geodesic equal adaptive

    def call(measure, steps):
        return lambda: wsym.sharpness(
            model, batches, loss, spec=spec, measure=measure, rho=0.05, steps=steps
        )

    fns = [call(m, s) for m in MEASURES for s in (FEW, MANY)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        times = median_times(fns, repeats, CLOCKS[clock])
    per_step = {m: (times[2 * i + 1] - times[2 * i]) / (MANY - FEW) for i, m in enumerate(MEASURES)}
    return per_step, blocks


def report(name, model, per_step, blocks):
    name = f"{name} [{blocks} blk]"
    size = sum(p.numel() for p in model.parameters())
    base = per_step["adaptive"]
    for m in MEASURES:
        t, ratio = per_step[m], per_step[m] / base
        check = "-" if m == "adaptive" else ("ok" if ratio <= GOAL else f"over {GOAL}x")
        print(f"{name:<26} {size:>7} {m:<13} {t:>12.5f} {ratio:>7.2f} {check:>10}")


def tiny_transformer():
    model = TinyTransformer()
    x, y = torch.randn(64, 10, 4), torch.randint(0, 10, (64,))
    return model, [(x, y)], nn.CrossEntropyLoss()


def bert(batch=8, tokens=16):
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
    )
    model = BertModel(config)
    x = {"input_ids": torch.randint(0, config.vocab_size, (batch, tokens))}
    y = torch.randint(0, 10, (batch,))
    ce = nn.CrossEntropyLoss()
    return model, [(x, y)], lambda out, t: ce(out.pooler_output[:, :10], t)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (0: leave torch's default)"
    )
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: time.perf_counter; cpu: this thread's CPU time (time.thread_time), "
        "less disturbed by other processes on a shared machine (one thread only)",
    )
    args = parser.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu measures one thread: use --threads 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, cpu, threads {torch.get_num_threads()}")
    print(
        f"per step = (t(steps={MANY}) - t(steps={FEW})) / {MANY - FEW}, "
        f"median of {args.repeats} repeats after warm-up, {args.clock} clock"
    )
    print(
        f"{'model [GL/GL(1) blocks]':<26} {'params':>7} {'measure':<13} {'s / step':>12} "
        f"{'ratio':>7} {'<= ' + str(GOAL):>10}"
    )
    models = (
        ("TinyTransformer", tiny_transformer),
        ("BERT small 8x16", bert),
        ("BERT small 32x64", lambda: bert(32, 64)),
    )
    for name, build in models:
        model, batches, loss = build()
        report(name, model, *step_times(model, batches, loss, args.repeats, args.clock))


if __name__ == "__main__":
    main()
