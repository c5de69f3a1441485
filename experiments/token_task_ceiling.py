"""How hard is a BERT-style zoo's downstream task, and does its pretraining help?

For the downstream task of a fine-tune preset with token inputs (``--preset``),
prints the test accuracy of baselines fitted on its training split:

* logistic regression on one-hot tokens (position by position);
* logistic regression on bigram counts (``vocab^2`` features);
* a linear probe (logistic regression) on the mean-pooled last hidden layer of
  the zoo's pretrained model (``--zoo``: a directory holding
  ``pretrained.safetensors``, built by ``wsym zoo build --preset ...``), and of
  the same architecture at its random initialization (seed 0);
* for a ``markov-tokens`` task, the Bayes classifier that knows the topic chains
  (with the token noise folded into the transition probabilities: an
  approximation, the noise being on tokens, not on transitions).

Chance is ``1 / classes``. Run::

    .venv/bin/python experiments/token_task_ceiling.py --zoo /tmp/bert-finetune
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression

from wsym.zoo import store
from wsym.zoo.architectures import initialise
from wsym.zoo.presets import load_preset
from wsym.zoo.pretrain import PRETRAINED
from wsym.zoo.tasks import load_task, markov_language


def fit(train, y_train, test, y_test) -> float:
    """Test accuracy of an L2-regularized logistic regression (C = 0.1)."""
    model = LogisticRegression(max_iter=3000, C=0.1).fit(train, y_train)
    return float(model.score(test, y_test))


def one_hot(x: np.ndarray, vocab: int) -> np.ndarray:
    """``(N, T * vocab)`` one-hot tokens."""
    return np.eye(vocab)[x].reshape(len(x), -1)


def bigrams(x: np.ndarray, vocab: int) -> np.ndarray:
    """``(N, vocab^2)`` counts of consecutive token pairs."""
    out = np.zeros((len(x), vocab * vocab))
    rows = np.repeat(np.arange(len(x)), x.shape[1] - 1)
    np.add.at(out, (rows, (x[:, :-1] * vocab + x[:, 1:]).ravel()), 1)
    return out


def features(model: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    """Mean-pooled last hidden layer of a token transformer, ``(N, dim)``."""
    with torch.no_grad():
        h = model.embed(x) + model.pos[: x.shape[1]]
        for block in model.blocks:
            h = block(h)
        return model.norm(h).mean(1).numpy()


def bayes(config: dict, x: np.ndarray, label_map) -> np.ndarray:
    """Classes of the topic whose chain makes ``x`` most likely."""
    keys = ("vocab", "topics", "beta", "concentration")
    defaults = {"vocab": 16, "topics": 10, "beta": 0.5, "concentration": 0.2}
    vocab, topics, beta, conc = (config.get(k, defaults[k]) for k in keys)
    chains = markov_language(vocab, topics, beta, conc, config.get("language_seed", 0))
    noise = config.get("noise", 0.0)
    chains = (1 - noise) * chains + noise / vocab
    logp = np.log(chains[:, x[:, :-1], x[:, 1:]]).sum(-1)
    return np.asarray(label_map)[logp.argmax(0)]


def main(argv=None):
    """Fit the baselines and print their test accuracies."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="bert-finetune", help="preset name or JSON path")
    ap.add_argument("--zoo", help="zoo directory with the pretrained model (optional)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    preset = load_preset(args.preset)
    task, vocab = preset["dataset"], int(preset["architecture"]["vocab"])
    data = load_task(task)
    xtr, ytr, xte, yte = (t.numpy() for t in (data.x_train, data.y_train, data.x_test, data.y_test))
    classes = int(preset["architecture"]["classes"])
    rows = {
        "one-hot logistic regression": fit(one_hot(xtr, vocab), ytr, one_hot(xte, vocab), yte),
        "bigram logistic regression": fit(bigrams(xtr, vocab), ytr, bigrams(xte, vocab), yte),
    }
    if task["name"] == "markov-tokens":
        label_map = task.get("label_map") or range(task.get("topics", 10))
        rows["Bayes (true chains)"] = float((bayes(task, xte, label_map) == yte).mean())
    architecture = {**preset["architecture"], **preset["pretrain"]["architecture"]}
    models = {"probe, random init": initialise(architecture, 0)}
    if args.zoo:
        state, _ = store.decode_shard(Path(args.zoo, PRETRAINED).read_bytes(), args.zoo)
        models["probe, pretrained"] = initialise(architecture, 0)
        models["probe, pretrained"].load_state_dict(state[-1])
    for name, model in models.items():
        model.eval()
        rows[name] = fit(features(model, data.x_train), ytr, features(model, data.x_test), yte)
    print(f"{task['name']}: {len(ytr)} train / {len(yte)} test, chance {1 / classes:.2f}")
    for name, acc in rows.items():
        print(f"{name:<30}{acc:.3f}")


if __name__ == "__main__":
    main()
