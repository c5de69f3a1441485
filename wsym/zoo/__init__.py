"""Model zoos: populations of trained networks, built fast, reproducibly, on one machine or Ray.

``wsym.zoo.build(preset, members, out, seed)`` trains (or resumes) a zoo in a
directory; ``wsym.zoo.load(out)`` gives back a :class:`Zoo` with the manifest,
the members table, an architecture factory and the members' state dicts.

* :mod:`wsym.zoo.presets` -- preset files and hyperparameter priors;
* :mod:`wsym.zoo.batched` -- batched training of many members at once;
* :mod:`wsym.zoo.mlp_trainer` -- its fast path: MLPs of every batch size in lock step;
* :mod:`wsym.zoo.stacked_mlp` -- stacked MLPs with a hand-written backward;
* :mod:`wsym.zoo.streams` -- each member's data, label noise, dropout masks and metrics;
* :mod:`wsym.zoo.stacked_optim` -- SGD and Adam on stacked parameters;
* :mod:`wsym.zoo.store` -- the directory format (manifest, CSV table, shards);
* :mod:`wsym.zoo.backends` -- local, multi-process and Ray execution;
* :mod:`wsym.zoo.build` -- planning, resuming and writing a build.
"""

from wsym.zoo.build import GENERATOR_VERSION, build
from wsym.zoo.presets import load_preset, preset_names
from wsym.zoo.zoo import Zoo, load

__all__ = ["GENERATOR_VERSION", "Zoo", "build", "load", "load_preset", "preset_names"]
