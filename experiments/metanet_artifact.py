"""Train the shipped meta-network models/metanet-mnist1d-mlp.safetensors (+ model card).

Interim: trains on the population written by
``experiments/metanet_population.py --arch mlp --members 160 --seed 0 --out /tmp/pop-mlp``
until data/zoos/mnist1d-mlp is on main; then use
``wsym metanet train --zoo data/zoos/mnist1d-mlp --out models/metanet-mnist1d-mlp.safetensors``.
"""

import sys

import torch

sys.path.insert(0, "experiments")
from metanet_population import ARCHS  # noqa: E402

from wsym.cli.metanet import model_card  # noqa: E402
from wsym.detect import detect  # noqa: E402
from wsym.metanet import fit, kendall_tau  # noqa: E402
from wsym.metanet.evaluate import zoo_splits  # noqa: E402
from wsym.metanet.population import load_population  # noqa: E402

NAME = (
    "population of experiments/metanet_population.py --arch mlp --members 160 --seed 0 "
    "(MLP 40-32-32-10, mnist1d)"
)
OUT = "models/metanet-mnist1d-mlp"

torch.set_num_threads(1)
zoo = load_population(sys.argv[1] if len(sys.argv) > 1 else "/tmp/pop-mlp", ARCHS["mlp"])
ids = zoo_splits(zoo)
gap = {r["id"]: r["gap"] for r in zoo.table}
spec = detect(zoo.model(0), zoo.example_inputs())
val = (zoo.state_dicts(ids["val"]), [gap[i] for i in ids["val"]])
train = zoo.state_dicts(ids["train"]), [gap[i] for i in ids["train"]]
p = fit(None, *train, spec=spec, validation=val, seed=0, epochs=120, patience=30)
y_test = torch.tensor([gap[i] for i in ids["test"]])
tau = kendall_tau(y_test, p.predict(zoo.state_dicts(ids["test"])))
p.config["card"] = {"zoo": NAME, "splits": {k: len(v) for k, v in ids.items()}, "test_tau": tau}
p.save(OUT + ".safetensors")
note = (
    "\nInterim artifact: retrain with `wsym metanet train --zoo data/zoos/mnist1d-mlp "
    "--out models/metanet-mnist1d-mlp.safetensors` once that zoo is on main.\n"
)
with open(OUT + ".md", "w") as f:
    f.write(model_card(p, NAME, ids, tau) + note)
print("test tau", tau, p.config["report"])
