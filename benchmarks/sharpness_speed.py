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

Models: ``wsym.models.networks.TinyTransformer()`` (default config) on a float input
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

Stock models (``--stock``, goal 1.3x): timm ``vit_tiny_patch16_224`` (full depth, batch
8 of 224x224 images), torchvision ``resnet18`` (batch 32 of 64x64) and a Hugging Face
GPT-2 small config (4 layers, width 128, 4 heads, batch 8 of 32 tokens), random weights,
cross-entropy against random classes. Here each ascent step is timed on its own
(:class:`StepClock`: from the end of one direction to the end of the next), the median
over the steps of ``--repeats`` interleaved 5-step calls per measure. Whole-call
differences ``(t(steps=5) - t(steps=1)) / 4`` carry the jitter of each call's setup
(GPT-2: the geodesic setup takes 0.8-1 s, ten steps' worth, and varies by 0.1-0.2 s under
load, 0.4x-0.8x of the ratio over 4 steps); they are printed beside ("calls"), with the share of
a geodesic-mix step spent in the horizontal projection
(:meth:`wsym.sharpness.vertical.Horizontal.project_flat`) and each measure's value.

Run:
    .venv/bin/python benchmarks/sharpness_speed.py [--repeats 10] [--threads 1] [--clock cpu]
    .venv/bin/python benchmarks/sharpness_speed.py --stock --repeats 2 --clock cpu
    .venv/bin/python benchmarks/sharpness_speed.py --stock --only gpt2 --repeats 5 --clock cpu
    .venv/bin/python benchmarks/sharpness_speed.py --stock --only gpt2 --phases --clock cpu

``--phases`` prints, per measure, the milliseconds per ascent step spent in each
phase of the step (:class:`PhaseClock`; nested phases are indented in :data:`PHASES`).
"""

import argparse
import statistics
import time
import warnings

import torch
from torch import nn

import wsym
from wsym.models.networks import TinyTransformer
from wsym.sharpness import measures, perturbation, vertical
from wsym.sharpness.quotient import Quotient

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


class ProjectionClock:
    """Accumulates the time spent in ``Horizontal.project_flat`` (the Gram solve) while active.

    ``project_flat`` is the whole horizontal projection (``project`` calls it; the
    Riemannian gradient calls it directly).
    """

    def __init__(self, clock):
        self.clock, self.total, self._orig = clock, 0.0, vertical.Horizontal.project_flat

    def __enter__(self):
        orig = self._orig

        def timed(h, xi, *args, **kwargs):
            start = self.clock()
            out = orig(h, xi, *args, **kwargs)
            self.total += self.clock() - start
            return out

        vertical.Horizontal.project_flat = timed
        return self

    def __exit__(self, *exc):
        vertical.Horizontal.project_flat = self._orig


class StepClock:
    """Times each ascent step of ``wsym.sharpness.measures.worst_case`` while active.

    A step runs from the end of one ``_direction`` call (loss, gradient, Riemannian
    gradient) to the end of the next: the projections onto the ball, the momentum update
    and the next direction. The first direction (at ``xi = 0``) ends no step, so the
    setup of a call (float64 copy, balancing, ``Quotient``, the Schur factors) is not in
    any step. Also the time ``projection`` (a :class:`ProjectionClock`) spent inside steps.
    """

    def __init__(self, clock, projection):
        self.clock, self.projection, self.steps, self.solves = clock, projection, [], []
        self._orig, self._last = (measures._direction, measures.worst_case), None

    def __enter__(self):
        direction, worst = self._orig

        def timed_direction(*args, **kwargs):
            out = direction(*args, **kwargs)
            now, solve = self.clock(), self.projection.total
            if self._last is not None:
                self.steps.append(now - self._last[0])
                self.solves.append(solve - self._last[1])
            self._last = (now, solve)
            return out

        def reset(*args, **kwargs):
            self._last = None
            return worst(*args, **kwargs)

        measures._direction, measures.worst_case = timed_direction, reset
        return self

    def __exit__(self, *exc):
        measures._direction, measures.worst_case = self._orig


class PhaseClock:
    """Accumulates the time spent in each phase of the ascent while active (``--phases``).

    Wraps the methods named in :data:`PHASES` (on their classes); a phase that calls
    another includes it (``project`` is inside ``gradient``, ``gather`` inside ``pullback``).
    The first direction of each ascent (at ``xi = 0``, which also builds the projection's
    Schur factors) is left out, as in :class:`StepClock`.
    """

    def __init__(self, clock):
        self.clock, self.totals, self._orig, self._first = clock, {}, [], False

    def __enter__(self):
        for label, owner, name in PHASES:
            orig = getattr(owner, name)
            self._orig.append((owner, name, orig, name in vars(owner)))
            setattr(owner, name, self._timed(label, orig))
        worst = measures.worst_case
        self._orig.append((measures, "worst_case", worst, True))

        def reset(*args, **kwargs):
            self._first = True
            return worst(*args, **kwargs)

        measures.worst_case = reset
        return self

    def _timed(self, label, orig):
        def timed(*args, **kwargs):
            first = label == "direction" and self._first
            kept = dict(self.totals) if first else None
            start = self.clock()
            out = orig(*args, **kwargs)
            self.totals[label] = self.totals.get(label, 0.0) + self.clock() - start
            if first:  # the ascent's first direction: not a step
                self.totals, self._first = kept, False
            return out

        return timed

    def __exit__(self, *exc):
        for owner, name, orig, own in reversed(self._orig):
            if own:
                setattr(owner, name, orig)
            else:  # inherited: drop the wrapper
                delattr(owner, name)


PHASES = (
    ("direction", measures, "_direction"),
    ("point (linearize)", perturbation.Geodesic, "linearize"),
    ("pullback", perturbation.Geodesic, "_pullback"),
    ("  gather", Quotient, "gather_stacks"),
    ("gradient", perturbation.Geodesic, "gradient"),
    ("  projection", vertical.Horizontal, "project_flat"),
    ("adaptive gradient", perturbation.Adaptive, "gradient"),
    ("norms", perturbation.Adaptive, "norm"),
    ("tangent sums", measures, "_add"),
)


def phase_times(model, batches, loss, repeats, clock, steps=5):
    """Per ascent step, the milliseconds of each phase (:class:`PhaseClock`), per measure.

    One warm-up call, then ``repeats`` calls of ``steps`` steps per measure (the first
    direction of each call left out).
    """
    spec = wsym.detect(model, batches[0][0])
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in MEASURES:

            def call(n, m=m):
                wsym.sharpness(model, batches, loss, spec=spec, measure=m, rho=0.05, steps=n)

            call(steps)
            totals = {}
            for _ in range(repeats):
                with PhaseClock(CLOCKS[clock]) as phases:
                    call(steps)
                for k, v in phases.totals.items():
                    totals[k] = totals.get(k, 0.0) + v
            out[m] = {k: 1e3 * v / (repeats * steps) for k, v in totals.items()}
    return out


def ascent_step_times(model, batches, loss, repeats, clock, steps=5):
    """Median seconds per ascent step of each measure, timed step by step (:class:`StepClock`).

    ``repeats`` interleaved calls of ``steps`` steps per measure after one warm-up call
    each; also the share of a geodesic-mix step spent in the horizontal projection and,
    for comparison, the per-step time from whole calls, ``(t(steps) - t(1)) / (steps - 1)``.
    """
    spec = wsym.detect(model, batches[0][0])
    params = {n: p.detach().double() for n, p in model.named_parameters()}
    blocks = len(Quotient(spec, params).blocks)

    def call(measure, n):
        return lambda: wsym.sharpness(
            model, batches, loss, spec=spec, measure=measure, rho=0.05, steps=n
        )

    tick = CLOCKS[clock]
    names = [m for m in MEASURES for _ in (1, steps)]
    fns = [call(m, n) for m in MEASURES for n in (1, steps)]
    per_step, shares, whole, values = {m: [] for m in MEASURES}, [], {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fn in fns:  # warm-up
            fn()
        calls = [[] for _ in fns]
        for _ in range(repeats):
            for i, (m, fn) in enumerate(zip(names, fns, strict=True)):
                with ProjectionClock(tick) as solve, StepClock(tick, solve) as steps_clock:
                    start = tick()
                    value = fn()
                    calls[i].append(tick() - start)
                if i % 2:
                    values[m] = value
                    per_step[m] += steps_clock.steps
                    if m == "geodesic-mix":
                        pairs = zip(steps_clock.solves, steps_clock.steps, strict=True)
                        shares += [a / b for a, b in pairs]
    for i, m in enumerate(MEASURES):
        few, many = statistics.median(calls[2 * i]), statistics.median(calls[2 * i + 1])
        whole[m] = (many - few) / (steps - 1)
    median = {m: statistics.median(v) for m, v in per_step.items()}
    return median, blocks, statistics.median(shares), whole, values


def step_times(model, batches, loss, repeats, clock, few=FEW, many=MANY):
    """Seconds per ascent step of each measure, ``(t(many) - t(few)) / (many - few)``.

    Also the share of a geodesic-mix step spent in the horizontal projection.
    """
    spec = wsym.detect(model, batches[0][0])
    params = {n: p.detach().double() for n, p in model.named_parameters()}
    blocks = len(Quotient(spec, params).blocks)  # 0 would make geodesic equal adaptive

    def call(measure, steps):
        return lambda: wsym.sharpness(
            model, batches, loss, spec=spec, measure=measure, rho=0.05, steps=steps
        )

    fns = [call(m, s) for m in MEASURES for s in (few, many)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        times = median_times(fns, repeats, CLOCKS[clock])
        with ProjectionClock(CLOCKS[clock]) as solve:
            fns[2]()
            few_share = solve.total
            fns[3]()
    per_step = {m: (times[2 * i + 1] - times[2 * i]) / (many - few) for i, m in enumerate(MEASURES)}
    share = (solve.total - 2 * few_share) / (many - few) / per_step["geodesic-mix"]
    return per_step, blocks, share


def report(name, model, per_step, blocks, share, whole=None, values=None, goal=GOAL):
    name = f"{name} [{blocks} blk]"
    size = sum(p.numel() for p in model.parameters())
    base = per_step["adaptive"]
    for m in MEASURES:
        t, ratio = per_step[m], per_step[m] / base
        check = "-" if m == "adaptive" else ("ok" if ratio <= goal else f"over {goal}x")
        solve = f"{share:>7.0%}" if m == "geodesic-mix" else f"{'':>7}"
        calls = f" {whole[m] / whole['adaptive']:>7.2f}" if whole else ""
        calls += f" {values[m]:>22.16g}" if values else ""
        print(f"{name:<26} {size:>8} {m:<13} {t:>12.5f} {ratio:>7.2f} {check:>10} {solve}{calls}")


def vit_tiny():
    import timm

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    x, y = torch.randn(8, 3, 224, 224), torch.randint(0, 1000, (8,))
    return model, [(x, y)], nn.CrossEntropyLoss()


def resnet18():
    import torchvision

    model = torchvision.models.resnet18()
    x, y = torch.randn(32, 3, 64, 64), torch.randint(0, 1000, (32,))
    return model, [(x, y)], nn.CrossEntropyLoss()


def gpt2():
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_embd=128, n_layer=4, n_head=4, vocab_size=512, n_positions=64)
    model = GPT2Model(config)
    x = {"input_ids": torch.randint(0, 512, (8, 32))}
    y = torch.randint(0, 10, (8,))
    ce = nn.CrossEntropyLoss()
    return model, [(x, y)], lambda out, t: ce(out.last_hidden_state[:, -1, :10], t)


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


STOCK = {
    "vit_tiny": ("vit_tiny 8x224", vit_tiny),
    "resnet18": ("resnet18 32x64", resnet18),
    "gpt2": ("GPT-2 8x32", gpt2),
}


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
    parser.add_argument(
        "--stock", action="store_true", help="timm ViT, torchvision resnet18, GPT-2 (goal 1.3x)"
    )
    parser.add_argument(
        "--only", nargs="*", choices=sorted(STOCK), help="with --stock: these models only"
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="with --stock: milliseconds per ascent step in each phase instead",
    )
    args = parser.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu measures one thread: use --threads 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, cpu, threads {torch.get_num_threads()}")
    if args.stock and args.phases:
        print(f"ms per ascent step, {args.repeats} calls of 5 steps, {args.clock} clock")
        for key in args.only or STOCK:
            name, build = STOCK[key]
            for m, phases in phase_times(*build(), args.repeats, args.clock).items():
                cells = "  ".join(f"{k.strip()} {v:.2f}" for k, v in phases.items())
                print(f"{name:<16} {m:<13} {cells}")
        return
    if args.stock:
        print(
            f"per step: median over the ascent steps of {args.repeats} interleaved calls of "
            f"5 steps each after warm-up, timed step by step, {args.clock} clock; "
            "calls: (t(steps=5) - t(steps=1)) / 4 of the same calls, for comparison; "
            "value: the worst case of the 5-step call (rho 0.05)"
        )
        print(
            f"{'model [GL/GL(1) blocks]':<26} {'params':>8} {'measure':<13} {'s / step':>12} "
            f"{'ratio':>7} {'goal':>10} {'solve':>7} {'calls':>7} {'value':>22}"
        )
        for key in args.only or STOCK:
            name, build = STOCK[key]
            model, batches, loss = build()
            per_step, blocks, share, whole, values = ascent_step_times(
                model, batches, loss, args.repeats, args.clock
            )
            report(name, model, per_step, blocks, share, whole, values, goal=1.3)
        return
    print(
        f"per step = (t(steps={MANY}) - t(steps={FEW})) / {MANY - FEW}, "
        f"median of {args.repeats} repeats after warm-up, {args.clock} clock"
    )
    print(
        f"{'model [GL/GL(1) blocks]':<26} {'params':>8} {'measure':<13} {'s / step':>12} "
        f"{'ratio':>7} {'goal':>10} {'solve':>7}"
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
