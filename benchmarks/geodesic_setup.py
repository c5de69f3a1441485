"""Time the diagonal balancing of the geodesic measures' setup on the stock GPT-2 config.

``wsym.sharpness`` evaluates the geodesic measures at the balanced point of the diagonal
groups (:func:`wsym.sharpness.gauge.balanced`, Newton's method on a convex objective);
on GPT-2 it is most of the setup a user waits for before the first ascent step. The
model is the small GPT-2 config of ``benchmarks/sharpness_speed.py --stock`` (random
weights, seed 0, float64). Prints the seconds of each of ``--repeats`` calls after one
warm-up call (this thread's CPU clock) and a checksum of the balanced point
(``sum of squares``), so that two libraries can be compared on the same point.

Run:
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/geodesic_setup.py --repeats 3
"""

import argparse
import time

import torch

import wsym
from wsym.sharpness.gauge import balanced


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_embd=128, n_layer=4, n_head=4, vocab_size=512, n_positions=64)
    model = GPT2Model(config)
    x = {"input_ids": torch.randint(0, 512, (8, 32))}
    spec = wsym.detect(model, x)
    state = {k: v.double() for k, v in model.state_dict().items()}
    point = balanced(spec, state)
    times = []
    for _ in range(args.repeats):
        start = time.thread_time()
        point = balanced(spec, state)
        times.append(time.thread_time() - start)
    checksum = sum(float((v.double() ** 2).sum()) for v in point.values() if v.is_floating_point())
    print(f"balanced: {', '.join(f'{t:.3f}' for t in times)} s; checksum {checksum!r}")


if __name__ == "__main__":
    main()
