"""Baseline predictors of generalization from weights, with one interface.

Each predictor has ``fit(train_sds, y_train, val_sds, y_val, seed)`` and
``predict(sds) -> Tensor`` and a ``claims`` string (the symmetries it is
invariant to by construction):

* :class:`Metanet` -- wsym's invariant graph meta-network (:func:`wsym.metanet.fit`);
* :class:`StatNN` -- per-tensor statistics (mean, variance, quantiles 0/25/50/75/100%)
  into scikit-learn gradient boosting (Unterthiner et al., 2020); with
  ``canonical=True`` on :func:`~wsym.metanet.invariant_form` weights instead;
* :class:`FlatMLP` -- an MLP on the flattened, standardized weights;
* :class:`NFN` -- neural functionals (Zhou et al., 2023; PyPI ``nfn``): ``NPLinear``
  layers and ``HNPPool`` on chains of linear/conv layers with biases;
* :class:`Sharpness` -- one number per network, a :func:`wsym.sharpness` measure
  on a fixed batch; R^2 from a least-squares line fitted on the training members.
"""

from __future__ import annotations

import torch
from torch import nn

from wsym.errors import WsymInputError
from wsym.group.kinds.modules import refuse_modules
from wsym.group.layout import refuse_relabeled
from wsym.group.spec import SymmetrySpec
from wsym.metanet.fit import fit
from wsym.metanet.graph import GraphSchema
from wsym.metanet.invariant import invariant_form
from wsym.metanet.predictor import Predictor, network_for
from wsym.metanet.statistics import tensor_statistics, train_vector_model


class Metanet:
    """wsym's graph meta-network (invariant to the whole spec).

    ``cache``: a dict shared between instances (e.g. across seeds) that keeps the
    invariant graph of every state dict it has seen (by ``id``, holding the dict
    itself so the id stays unique), so it is prepared once.
    """

    name, claims = "wsym metanet", "all groups of the spec"

    def __init__(self, spec: SymmetrySpec, cache: dict | None = None, **options):
        self.spec, self.options, self.predictor = spec, options, None
        self.cache = {} if cache is None else cache
        self._reader = None  # reads invariant graphs (they depend on the spec only)

    def _graphs(self, sds) -> list:
        if self._reader is None:
            empty = network_for(GraphSchema.from_spec(self.spec), 1, 0, 1)
            self._reader = Predictor(self.spec, empty, {})
        new = [sd for sd in sds if self.cache.get(id(sd), (None,))[0] is not sd]
        graphs = self._reader.graphs(new)
        self.cache.update((id(sd), (sd, g)) for sd, g in zip(new, graphs, strict=True))
        return [self.cache[id(sd)][1] for sd in sds]

    def fit(self, sds, y, val_sds, y_val, seed: int = 0) -> None:  # noqa: D102
        graphs, val_graphs = self._graphs(sds), self._graphs(val_sds)
        self.predictor = fit(
            None,
            sds,
            y,
            spec=self.spec,
            validation=(val_sds, y_val),
            seed=seed,
            graphs=graphs,
            val_graphs=val_graphs,
            **self.options,
        )

    def predict(self, sds) -> torch.Tensor:  # noqa: D102
        return self.predictor.predict_graphs(self._graphs(sds))


def weight_statistics(sd: dict) -> torch.Tensor:
    """Mean, variance and 5 quantiles of every floating tensor, in sorted key order."""
    return torch.cat(
        [
            tensor_statistics(sd[k])
            for k in sorted(sd)
            if sd[k].is_floating_point() and sd[k].numel() > 0
        ]
    )


class StatNN:
    """Weight statistics + gradient boosting (invariant to permutations only)."""

    def __init__(
        self, spec: SymmetrySpec | None = None, canonical: bool = False, cache: dict | None = None
    ):
        self.spec, self.canonical = spec, canonical
        self.cache = {} if cache is None else cache  # as Metanet's: statistics by id
        self.name = "StatNN (canonical)" if canonical else "StatNN"
        self.claims = "all groups of the spec" if canonical else "permutation"

    def _statistics(self, sd) -> torch.Tensor:
        if self.cache.get(id(sd), (None,))[0] is not sd:
            form = invariant_form(sd, self.spec) if self.canonical else sd
            self.cache[id(sd)] = (sd, weight_statistics(form))
        return self.cache[id(sd)][1]

    def _x(self, sds):
        # asinh: monotone (gradient boosting's splits are unchanged) and within float32,
        # which scikit-learn's trees use (canonical statistics reach 1e83 on mnist1d-cnn)
        return torch.asinh(torch.stack([self._statistics(sd) for sd in sds])).numpy()

    def fit(self, sds, y, val_sds, y_val, seed: int = 0) -> None:  # noqa: D102
        from sklearn.ensemble import GradientBoostingRegressor

        self.model = GradientBoostingRegressor(
            n_estimators=200, max_depth=3, learning_rate=0.05, subsample=0.8, random_state=seed
        )
        self.model.fit(self._x(sds), torch.as_tensor(y, dtype=torch.float64).numpy())

    def predict(self, sds) -> torch.Tensor:  # noqa: D102
        return torch.as_tensor(self.model.predict(self._x(sds)))


class _Standardized:
    """Target standardization shared by the neural baselines."""

    def _scale(self, y):
        y = torch.as_tensor(y, dtype=torch.float32)
        self.mean, self.std = y.mean(), y.std().clamp(min=1e-12)
        return (y - self.mean) / self.std

    def _unscale(self, z):
        return (z.reshape(-1) * self.std + self.mean).double()


class FlatMLP(_Standardized):
    """An MLP on all weights flattened in sorted key order (no invariance)."""

    name, claims = "flat MLP", "none"

    def _x(self, sds):
        return torch.stack(
            [
                torch.cat(
                    [
                        sd[k].detach().float().reshape(-1)
                        for k in sorted(sd)
                        if sd[k].is_floating_point()
                    ]
                )
                for sd in sds
            ]
        )

    def fit(self, sds, y, val_sds, y_val, seed: int = 0) -> None:  # noqa: D102
        x = self._x(sds)
        self.mu, self.sd = x.mean(0), x.std(0).clamp(min=1e-6)
        torch.manual_seed(seed)
        self.net = nn.Sequential(
            nn.Linear(x.shape[1], 256),
            nn.ReLU(),
            nn.Dropout(0.1),
            nn.Linear(256, 64),
            nn.ReLU(),
            nn.Linear(64, 1),
        )
        z = self._scale(y)
        zv = (torch.as_tensor(y_val, dtype=torch.float32) - self.mean) / self.std
        self.net = train_vector_model(
            self.net,
            (x - self.mu) / self.sd,
            z,
            (self._x(val_sds) - self.mu) / self.sd,
            zv,
            seed=seed,
        )

    @torch.no_grad()
    def predict(self, sds) -> torch.Tensor:  # noqa: D102
        return self._unscale(self.net((self._x(sds) - self.mu) / self.sd))


def nfn_layers(spec: SymmetrySpec) -> list[tuple[str, str]] | None:
    """``[(weight, bias), ...]`` if the spec's parameters form a linear/conv chain, else None.

    A chain: every parameter is a weight ``(out, in, *kernel)`` or its bias
    ``(out,)``, each weight's input axis is the previous weight's output class.
    """
    refuse_relabeled(spec, "the NFN baseline")
    refuse_modules(spec, "the NFN baseline")
    layout = spec.layout
    params = [p for p, _ in spec.layouts if p not in spec.buffers]
    weights = [p for p in params if len(layout[p]) >= 2]
    biases = [p for p in params if len(layout[p]) == 1]
    if not weights or len(weights) != len(biases) or len(params) != 2 * len(weights):
        return None

    def cls(p, d):
        from wsym.group.spec import leaves

        lv = leaves(layout[p][d])
        return lv[0].cls if len(lv) == 1 else None

    out = []
    for i, w in enumerate(weights):
        b = next((b for b in biases if cls(b, 0) == cls(w, 0) and cls(w, 0) is not None), None)
        if b is None or (i and cls(w, 1) != cls(weights[i - 1], 0)):
            return None
        out.append((w, b))
    return out


class NFN(_Standardized):
    """NPLinear x2 + HNPPool + MLP (nfn package); permutation-invariant (hidden units)."""

    name, claims = "NFN (NP)", "permutation"

    def __init__(self, spec: SymmetrySpec, channels: int = 16):
        try:
            import nfn  # noqa: F401
        except ImportError as err:
            raise ImportError(
                "the NFN baseline needs the nfn package: pip install 'wsym[nfn]'"
            ) from err
        self.layers = nfn_layers(spec)
        if self.layers is None:
            raise WsymInputError("NFN applies to chains of linear/conv layers with biases only")
        self.channels = channels

    def _x(self, sds):
        from nfn.common import WeightSpaceFeatures

        ws = [torch.stack([sd[w].float() for sd in sds])[:, None] for w, _ in self.layers]
        bs = [torch.stack([sd[b].float() for sd in sds])[:, None] for _, b in self.layers]
        return WeightSpaceFeatures(ws, bs)

    def _network(self, feats):
        from nfn import layers
        from nfn.common import network_spec_from_wsfeat

        spec = network_spec_from_wsfeat(feats)
        c = self.channels
        pooled = layers.HNPPool.get_num_outs(spec) * c
        return nn.Sequential(
            layers.NPLinear(spec, 1, c, io_embed=True),
            layers.TupleOp(nn.ReLU()),
            layers.NPLinear(spec, c, c, io_embed=True),
            layers.TupleOp(nn.ReLU()),
            layers.HNPPool(spec),
            nn.Flatten(),
            nn.Linear(pooled, 64),
            nn.ReLU(),
            nn.Linear(64, 1),
        )

    def fit(self, sds, y, val_sds, y_val, seed: int = 0) -> None:  # noqa: D102
        feats = self._x(sds)
        self.scale = (
            [w.std() for w in feats.weights],
            [b.std().clamp(min=1e-6) for b in feats.biases],
        )
        torch.manual_seed(seed)
        self.net = self._network(feats)
        z = self._scale(y)
        zv = (torch.as_tensor(y_val, dtype=torch.float32) - self.mean) / self.std
        self.net = train_vector_model(
            self.net, _Indexable(self._norm(feats)), z, self._norm(self._x(val_sds)), zv, seed=seed
        )

    def _norm(self, feats):
        from nfn.common import WeightSpaceFeatures

        ws, bs = self.scale
        return WeightSpaceFeatures(
            [w / s for w, s in zip(feats.weights, ws, strict=True)],
            [b / s for b, s in zip(feats.biases, bs, strict=True)],
        )

    @torch.no_grad()
    def predict(self, sds) -> torch.Tensor:  # noqa: D102
        return self._unscale(self.net(self._norm(self._x(sds))))


class _Indexable:
    """WeightSpaceFeatures indexed by a batch of member ids."""

    def __init__(self, feats):
        self.feats = feats

    def __getitem__(self, idx):
        from nfn.common import WeightSpaceFeatures

        return WeightSpaceFeatures(
            [w[idx] for w in self.feats.weights], [b[idx] for b in self.feats.biases]
        )


class Sharpness:
    """A :func:`wsym.sharpness` measure as a one-number predictor (line fitted for R^2)."""

    claims_by_measure = {
        "adaptive": "scaling (average case: in distribution for permutations)",
        "geodesic-mix": "scaling, gl (worst case)",
        "fisher": "elementwise rescalings",
        "hessian-trace": "permutation, orthogonal",
    }

    def __init__(self, factory, batches, measure: str, spec: SymmetrySpec | None = None, **kw):
        self.factory, self.batches, self.measure, self.spec = factory, batches, measure, spec
        self.kw, self.cache = kw, {}
        self.name, self.claims = f"sharpness: {measure}", self.claims_by_measure.get(measure, "?")

    def values(self, sds) -> torch.Tensor:
        """The measure on every state dict."""
        from wsym.sharpness import sharpness

        out = []
        for sd in sds:
            if id(sd) in self.cache:
                out.append(self.cache[id(sd)])
                continue
            model = self.factory()
            model.load_state_dict(
                {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}
            )
            out.append(
                sharpness(
                    model,
                    self.batches,
                    nn.functional.cross_entropy,
                    spec=self.spec,
                    measure=self.measure,
                    **self.kw,
                )
            )
            self.cache[id(sd)] = out[-1]
        return torch.tensor(out, dtype=torch.float64)

    def fit(self, sds, y, val_sds, y_val, seed: int = 0) -> None:  # noqa: D102
        s = self.values(sds)
        y = torch.as_tensor(y, dtype=torch.float64)
        a = torch.stack([s, torch.ones_like(s)], 1)
        self.coef = torch.linalg.lstsq(a, y[:, None]).solution[:, 0]

    def predict(self, sds) -> torch.Tensor:  # noqa: D102
        return self.values(sds) * self.coef[0] + self.coef[1]
