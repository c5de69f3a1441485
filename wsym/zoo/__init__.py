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
* :mod:`wsym.zoo.dispatch` -- local, multi-process and Ray execution of independent tasks;
* :mod:`wsym.zoo.backends` -- units of members to train, on those backends;
* :mod:`wsym.zoo.measure` -- sharpness of every member and its tau with the gap, on them;
* :mod:`wsym.zoo.build` -- planning, resuming and writing a build.
"""

from wsym.zoo.build import GENERATOR_VERSION, build
from wsym.zoo.measure import ZooSharpness, measure_sharpness
from wsym.zoo.presets import load_preset, preset_names
from wsym.zoo.zoo import Zoo, load

__all__ = [
    "GENERATOR_VERSION",
    "Zoo",
    "ZooSharpness",
    "build",
    "load",
    "load_preset",
    "measure_sharpness",
    "preset_names",
]
