"""Benchmark: ``wsym.detect`` on Llama-shaped models at the sizes people hold them.

Run from the repository root (one model per process: peak RSS is the process's)::

    flock /tmp/wsym-bigmem.lock env OMP_NUM_THREADS=1 PYTHONPATH=. \\
        .venv/bin/python benchmarks/scale_detect.py --model tinyllama
    flock /tmp/wsym-bigmem.lock env OMP_NUM_THREADS=1 PYTHONPATH=. \\
        .venv/bin/python benchmarks/scale_detect.py --model llama2-7b --dtype bfloat16

The model is a Hugging Face ``LlamaForCausalLM`` built from its config on the
``meta`` device and materialized tensor by tensor with cheap fills (``normal_``
in the chosen dtype; norms at 1): nothing is downloaded, and a 7B model is ready in
a minute. ``wsym.detect`` then runs on ``--tokens`` random token ids. Printed: the
parameter count, the float32 size and the size in the model's dtype, the RSS
after building, the detection's seconds, its groups, and the process's peak RSS
(``ru_maxrss``) in GiB and as a multiple of the float32 size. ``--stream 0`` forces
the whole-model verification (two float64 copies of the weights) for comparison.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
import warnings
from collections import Counter

import torch

CONFIGS = {
    # TinyLlama-1.1B's shape
    "tinyllama": dict(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=32000,
    ),
    # Llama-2-7B's shape
    "llama2-7b": dict(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
    ),
    # a small one for a quick check of the script
    "llama-50m": dict(
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=32000,
    ),
}


def _gib(n: float) -> float:
    return n / 2**30


def _rss_now() -> float:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmRSS"))
    return int(line.split()[1]) * 1024


def _peak() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def build(name: str, dtype) -> torch.nn.Module:
    """The model on ``meta``, then each tensor made real with a cheap random fill."""
    import transformers

    cfg = transformers.LlamaConfig(**CONFIGS[name], torch_dtype=dtype)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    gen = torch.Generator().manual_seed(0)
    for module in model.modules():
        for kind in ("_parameters", "_buffers"):
            table = getattr(module, kind)
            for key, t in list(table.items()):
                if t is None or t.device.type != "meta":
                    continue
                real = torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype)
                if t.ndim == 1 and t.is_floating_point():
                    real.fill_(1.0)  # norm weights
                elif t.is_floating_point():
                    real.normal_(0.0, 0.02, generator=gen)
                table[key] = (
                    torch.nn.Parameter(real, requires_grad=False) if kind == "_parameters" else real
                )
    for module in model.modules():  # rotary tables are computed, not stored: recompute them
        if hasattr(module, "inv_freq") and hasattr(module, "rope_init_fn"):
            inv_freq, scaling = module.rope_init_fn(module.config, torch.device("cpu"))
            module.register_buffer("inv_freq", inv_freq, persistent=False)
            module.original_inv_freq = inv_freq
            module.attention_scaling = scaling
    model.tie_weights()
    return model.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tinyllama", choices=sorted(CONFIGS))
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--stream", type=int, default=-1, help="1/0 forces streamed/whole verification")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    import wsym
    from wsym.detect import find_candidates, verify_candidates
    from wsym.detect.tracing.export import record_trace

    t0 = time.perf_counter()
    model = build(args.model, dtype)
    built = time.perf_counter() - t0
    n = sum(p.numel() for p in model.parameters())
    rss_built = _rss_now()
    x = torch.randint(
        0, model.config.vocab_size, (1, args.tokens), generator=torch.Generator().manual_seed(1)
    )
    stream = None if args.stream < 0 else bool(args.stream)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if stream is None:
            spec = wsym.detect(model, x)
        else:
            traced = record_trace(model, x)
            spec = verify_candidates(find_candidates(traced, model), model, x, stream=stream)
    seconds = time.perf_counter() - t0
    peak = _peak()
    f32 = 4 * n
    row = {
        "model": args.model,
        "dtype": args.dtype,
        "parameters": n,
        "float32_gib": round(_gib(f32), 2),
        "model_gib": round(_gib(n * torch.finfo(dtype).bits / 8), 2),
        "build_s": round(built, 1),
        "rss_after_build_gib": round(_gib(rss_built), 2),
        "detect_s": round(seconds, 1),
        "groups": len(spec.groups),
        "kinds": dict(Counter(g.kind for g in spec.groups)),
        "dropped": sum("dropped" in str(w.message) for w in caught),
        "peak_rss_gib": round(_gib(peak), 2),
        "peak_over_float32": round(peak / f32, 2),
    }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
