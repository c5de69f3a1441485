r"""Datasets of zoo presets: :mod:`wsym.io.datasets`'s offline sets and a sparse regression.

``{"name": "mnist1d" | "mnist1d-seq" | "digits", "seed": s}`` loads
:func:`wsym.io.datasets.load`. ``{"name": "sparse-regression", ...}`` draws the task of
diagonal linear networks: Gaussian inputs ``x ~ N(0, I_d)``, a ground truth
``w*`` with ``nonzero`` entries ``N(0, 1)`` (the rest zero), targets
``y = x^T w* + noise * N(0, 1)``; ``n_train`` training and ``n_test`` test
examples. Its targets are float32 ``(N,)`` and it is returned as a
:class:`wsym.io.datasets.Dataset` (whose ``num_classes`` is meaningless there).

``{"name": "mnist1d-patches", ...}`` is mnist1d as ``length / patch`` patches
of ``patch`` features, from a generator of any size and configuration: the
upstream and downstream tasks of the fine-tune zoos. Options: ``seed``,
``num_samples`` (80/20 train/test), ``generator`` (mnist1d generator arguments
to replace, e.g. ``{"iid_noise_scale": 0.1}``: a shifted distribution),
``n_train`` (keep the first ``n_train`` training examples), ``label_map``
(``label_map[digit]`` is the class: a different task on the same signals).

``{"name": "mnist1d-tokens", ...}`` takes the same options (but ``patch``) and
turns each signal into ``40 / stride`` tokens: the mean of ``stride`` samples,
cut into ``levels`` bins of equal mass on the training split (token ids
``0..levels-1``). With ``mask`` (a fraction), it is a masked-token task: that
fraction of each sequence's positions (at least one, drawn with ``mask_seed``)
becomes the mask token ``levels``; targets are ``(N, T)`` original tokens there
and :data:`IGNORE` elsewhere. Vocabulary: ``levels + 1``.

``{"name": "markov-tokens", ...}`` is a synthetic language with hidden topics:
``topics`` Markov chains over ``vocab`` tokens, drawn once from ``language_seed``,
row ``i`` of topic ``k``'s transition matrix

.. math::
    P_k[i] = (1 - \beta)\, B[i] + \beta\, D_k[i], \qquad
    B[i], D_k[i] \sim \mathrm{Dirichlet}(c \mathbf{1}),

a shared part ``B`` and a topic's own part ``D_k`` (``beta``, ``concentration``
``c``). A sequence draws its topic uniformly, a uniform first token, then
``length - 1`` transitions; ``noise`` replaces each token by a uniform one with
that probability (a shifted distribution). The label is the topic (``label_map``
applies); ``mask`` and ``mask_seed`` make it a masked-token task as above (mask
token ``vocab``, vocabulary ``vocab + 1``). Predicting a masked token well needs
the topic, which the context reveals only statistically: what masked-token
pretraining learns is what the downstream topic classification needs.

Example:
    >>> data = load_task({"name": "sparse-regression", "n_train": 8, "n_test": 4, "d": 6,
    ...                   "nonzero": 2, "noise": 0.0, "seed": 0})
    >>> data.x_train.shape, data.y_test.dtype
    (torch.Size([8, 6]), torch.float32)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from wsym.errors import WsymInputError
from wsym.io import datasets as wdata

NAMES = (
    *wdata.NAMES,
    "sparse-regression",
    "mnist1d-patches",
    "mnist1d-tokens",
    "markov-tokens",
)
#: Target of positions a token-level loss ignores (``F.cross_entropy``'s default).
IGNORE = -100


def load_task(config: dict[str, Any]) -> wdata.Dataset:
    """The dataset a preset's ``dataset`` entry names (see the module docstring)."""
    options = dict(config)
    name = options.pop("name", None)
    if name in wdata.NAMES:
        return wdata.load(name, seed=int(options.get("seed", 0)))
    if name == "sparse-regression":
        return sparse_regression(**options)
    if name == "mnist1d-patches":
        return mnist1d_patches(**options)
    if name == "mnist1d-tokens":
        return mnist1d_tokens(**options)
    if name == "markov-tokens":
        return markov_tokens(**options)
    raise WsymInputError(f"unknown zoo dataset {name!r}; use one of {', '.join(NAMES)}")


def sparse_regression(
    n_train: int = 40,
    n_test: int = 1000,
    d: int = 100,
    nonzero: int = 10,
    noise: float = 0.0,
    seed: int = 0,
) -> wdata.Dataset:
    """Sparse linear regression with Gaussian inputs (see the module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_train + n_test, d, generator=gen, dtype=torch.float64)
    w_star = torch.zeros(d, dtype=torch.float64)
    support = torch.randperm(d, generator=gen)[:nonzero]
    w_star[support] = torch.randn(nonzero, generator=gen, dtype=torch.float64)
    y = x @ w_star + noise * torch.randn(n_train + n_test, generator=gen, dtype=torch.float64)
    x, y = x.float(), y.float()
    return wdata.Dataset(
        x[:n_train], y[:n_train], x[n_train:], y[n_train:], name="sparse-regression"
    )


def mnist1d_patches(
    seed: int = 0,
    num_samples: int = 5000,
    patch: int = 4,
    generator: dict[str, float] | None = None,
    n_train: int | None = None,
    label_map: list[int] | None = None,
) -> wdata.Dataset:
    """mnist1d of any generator configuration as patches (see the module docstring)."""
    options = tuple(sorted((generator or {}).items()))
    x_train, y_train, x_test, y_test = wdata._mnist1d(int(seed), int(num_samples), options)
    length = x_train.shape[1]
    if length % patch:
        raise WsymInputError(f"mnist1d-patches: patch {patch} does not divide length {length}")
    if label_map is not None and len(label_map) != 10:
        raise WsymInputError("mnist1d-patches: label_map needs one class per digit (10 entries)")
    keep = len(y_train) if n_train is None else int(n_train)
    cut = wdata._from_numpy(x_train[:keep], y_train[:keep], x_test, y_test, "mnist1d-patches")
    relabel = torch.tensor(label_map if label_map is not None else range(10))
    return wdata.Dataset(
        cut.x_train.view(len(cut.x_train), -1, patch),
        relabel[cut.y_train],
        cut.x_test.view(len(cut.x_test), -1, patch),
        relabel[cut.y_test],
        name="mnist1d-patches",
    )


def mnist1d_tokens(
    seed: int = 0,
    num_samples: int = 5000,
    levels: int = 16,
    stride: int = 2,
    generator: dict[str, float] | None = None,
    n_train: int | None = None,
    label_map: list[int] | None = None,
    mask: float | None = None,
    mask_seed: int = 0,
) -> wdata.Dataset:
    """mnist1d as token sequences, classified or masked (see the module docstring)."""
    signals = mnist1d_patches(seed, num_samples, stride, generator, n_train, label_map)
    train, test = signals.x_train.mean(-1), signals.x_test.mean(-1)
    cuts = torch.quantile(train.flatten().double(), torch.linspace(0, 1, levels + 1)[1:-1].double())
    x_train = torch.bucketize(train.double(), cuts)
    x_test = torch.bucketize(test.double(), cuts)
    split = (x_train, signals.y_train, x_test, signals.y_test)
    return _token_dataset(split, mask, mask_seed, levels, "mnist1d-tokens")


def markov_language(
    vocab: int, topics: int, beta: float, concentration: float, seed: int
) -> np.ndarray:
    """The transition matrices ``(topics, vocab, vocab)`` of the topic chains (module docstring)."""
    if not 0.0 <= beta <= 1.0 or concentration <= 0:
        raise WsymInputError("markov-tokens: beta must lie in [0, 1] and concentration be > 0")
    rng = np.random.default_rng(seed)
    shared = rng.dirichlet(np.full(vocab, concentration), size=vocab)
    own = rng.dirichlet(np.full(vocab, concentration), size=(topics, vocab))
    return (1 - beta) * shared + beta * own


def markov_tokens(
    seed: int = 0,
    num_samples: int = 5000,
    vocab: int = 16,
    length: int = 20,
    topics: int = 10,
    beta: float = 0.5,
    concentration: float = 0.2,
    language_seed: int = 0,
    noise: float = 0.0,
    n_train: int | None = None,
    label_map: list[int] | None = None,
    mask: float | None = None,
    mask_seed: int = 0,
) -> wdata.Dataset:
    """Token sequences of hidden-topic Markov chains (see the module docstring)."""
    if label_map is not None and len(label_map) != topics:
        raise WsymInputError(f"markov-tokens: label_map needs one class per topic ({topics})")
    chains = markov_language(vocab, topics, beta, concentration, language_seed).cumsum(-1)
    rng = np.random.default_rng(seed)
    topic = rng.integers(0, topics, num_samples)
    tokens = np.empty((num_samples, length), dtype=np.int64)
    tokens[:, 0] = rng.integers(0, vocab, num_samples)
    for t in range(1, length):
        u = rng.random((num_samples, 1))
        tokens[:, t] = np.minimum((u > chains[topic, tokens[:, t - 1]]).sum(-1), vocab - 1)
    flip = rng.random(tokens.shape) < noise
    tokens = np.where(flip, rng.integers(0, vocab, tokens.shape), tokens)
    labels = np.asarray(label_map if label_map is not None else range(topics))[topic]
    cut = num_samples * 4 // 5
    keep = cut if n_train is None else min(int(n_train), cut)
    x, y = torch.from_numpy(tokens), torch.from_numpy(labels.astype(np.int64))
    split = (x[:keep], y[:keep], x[cut:], y[cut:])
    return _token_dataset(split, mask, mask_seed, vocab, "markov-tokens")


def _token_dataset(split, mask: float | None, mask_seed: int, token: int, name: str):
    """``(x_train, y_train, x_test, y_test)`` as a dataset, masked-token with ``mask``."""
    if mask is None:
        return wdata.Dataset(*split, name=name)
    gen = torch.Generator().manual_seed(mask_seed)
    train, test = (_masked(x, float(mask), token, gen) for x in (split[0], split[2]))
    return wdata.Dataset(*train, *test, name=name)


def _masked(tokens: torch.Tensor, fraction: float, token: int, gen: torch.Generator):
    """``tokens`` with ``fraction`` of each row's positions masked, and the targets there."""
    n, t = tokens.shape
    count = max(1, round(fraction * t))
    positions = torch.rand(n, t, generator=gen).argsort(dim=1)[:, :count]
    hidden = torch.zeros(n, t, dtype=torch.bool).scatter_(1, positions, True)
    targets = torch.where(hidden, tokens, torch.full_like(tokens, IGNORE))
    return tokens.masked_fill(hidden, token), targets
