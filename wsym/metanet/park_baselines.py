"""Predictors for a park of architectures, with one interface (as :mod:`wsym.metanet.baselines`).

Members are ``(spec, state_dict)`` pairs of any architectures. Each predictor
has ``fit(members, y, val_members, y_val, seed)``, ``predict(members)`` and a
``claims`` string (the symmetries it is invariant to by construction):

* :class:`ParkMetanet` -- :func:`~wsym.metanet.park_fit.fit_park`, one network for
  every architecture (``branches`` both / stats / graph); with ``canonical=False``
  and no attention products it is an NG-GNN-style graph network on raw weights
  (Kofinas et al., 2024: per-layer edges and nodes, no invariant forms);
* :class:`LayerStatNN` -- StatNN (Unterthiner et al., 2020) on per-layer
  statistics (mean, variance, quantiles of every tensor, in the spec's tensor
  order) zero-padded to the deepest architecture, as Neural Graphs evaluates it on
  mixed zoos; ``canonical=True`` on :func:`~wsym.metanet.invariant_form` weights;
* :class:`PerArchitecture` -- one wsym meta-network (:class:`~wsym.metanet.baselines.Metanet`)
  per architecture, each on that architecture's members alone (none for an
  architecture it has not seen).
"""

from __future__ import annotations

import torch

from wsym.errors import WsymInputError
from wsym.metanet.baselines import Metanet
from wsym.metanet.invariant import invariant_form
from wsym.metanet.park import ParkNet, ParkPredictor, spec_key
from wsym.metanet.park_fit import fit_park
from wsym.metanet.statistics import tensor_statistics


class _ByIdentity:
    """Values computed once per state dict (held, so its ``id`` stays unique)."""

    def __init__(self, compute):
        self.compute, self.store = compute, {}

    def __call__(self, members) -> list:
        out = []
        for spec, sd in members:
            got = self.store.get(id(sd))
            if got is None or got[0] is not sd:
                got = self.store[id(sd)] = (sd, self.compute(spec, sd))
            out.append(got[1])
        return out


class ParkMetanet:
    """One meta-network for every architecture (see :func:`~wsym.metanet.park_fit.fit_park`).

    ``cache``: a dict shared between instances with the same ``canonical`` and
    ``products`` (across seeds and branches), so graphs are prepared once.
    ``on_epoch``: the progress hook of :func:`~wsym.metanet.park_fit.fit_park` (settable).
    """

    def __init__(
        self,
        branches: str = "both",
        canonical: bool = True,
        products: bool = True,
        cache: dict | None = None,
        **options,
    ):
        self.branches, self.canonical, self.products = branches, canonical, products
        self.options, self.predictor, self.on_epoch = options, None, None
        self.claims = "each member's whole group" if canonical else "permutation"
        reader = ParkPredictor(ParkNet(1, 0), {}, {})  # reads graphs only

        def graph(spec, sd):
            schema = reader.add_architecture(spec)
            g = reader.graph_of(schema, sd, 0, canonical)
            if not products:
                keep = g.edge_role < 3  # linear, conv, pooled: no attention products
                g.edge_index, g.edge_x, g.edge_role = (
                    g.edge_index[:, keep],
                    g.edge_x[keep],
                    g.edge_role[keep],
                )
            return g

        self.graphs = _ByIdentity(graph)
        if cache is not None:
            self.graphs.store = cache

    def fit(self, members, y, val_members, y_val, seed: int = 0) -> None:  # noqa: D102
        self.predictor = fit_park(
            members,
            y,
            validation=(val_members, y_val),
            seed=seed,
            branches=self.branches,
            graphs=self.graphs(members),
            val_graphs=self.graphs(val_members),
            on_epoch=self.on_epoch,
            **self.options,
        )

    def predict(self, members) -> torch.Tensor:  # noqa: D102
        return self.predictor.predict_graphs(self.graphs(members))


def layer_statistics(spec, sd: dict) -> torch.Tensor:
    """``(7 * tensors,)`` mean, variance, 5 quantiles of every tensor, in the spec's order."""
    return torch.cat([tensor_statistics(sd[name]) for name, _ in spec.layouts if name in sd])


class LayerStatNN:
    """Per-layer statistics zero-padded to the deepest architecture + gradient boosting."""

    def __init__(self, canonical: bool = False):
        self.canonical = canonical
        self.name = "StatNN per layer" + (" (canonical)" if canonical else "")
        self.claims = "each member's whole group" if canonical else "permutation"

        def stats(spec, sd):
            return layer_statistics(spec, invariant_form(sd, spec) if canonical else sd)

        self.stats = _ByIdentity(stats)

    def _x(self, members):
        rows = self.stats(members)
        width = self.width
        # asinh: monotone, and canonical statistics of nearly dead units exceed float32
        x = torch.zeros(len(rows), width, dtype=torch.float64)
        for i, r in enumerate(rows):
            x[i, : min(width, len(r))] = r[:width]
        return torch.asinh(x).numpy()

    def fit(self, members, y, val_members, y_val, seed: int = 0) -> None:  # noqa: D102
        from sklearn.ensemble import GradientBoostingRegressor

        self.width = max(len(r) for r in self.stats(members))
        self.model = GradientBoostingRegressor(
            n_estimators=200, max_depth=3, learning_rate=0.05, subsample=0.8, random_state=seed
        )
        self.model.fit(self._x(members), torch.as_tensor(y, dtype=torch.float64).numpy())

    def predict(self, members) -> torch.Tensor:  # noqa: D102
        return torch.as_tensor(self.model.predict(self._x(members)))


class PerArchitecture:
    """One wsym meta-network per architecture, fitted on that architecture's members alone.

    An architecture with fewer than ``min_members`` training members predicts
    its training mean (a constant: ties in Kendall tau).
    """

    name, claims = "per-architecture wsym metanets", "each member's whole group"

    def __init__(self, min_members: int = 4, **options):
        self.min_members, self.options = min_members, options

    def fit(self, members, y, val_members, y_val, seed: int = 0) -> None:  # noqa: D102
        y = torch.as_tensor(y, dtype=torch.float64)
        y_val = torch.as_tensor(y_val, dtype=torch.float64)
        self.models = {}
        for key, idx in _groups(members).items():
            spec = members[idx[0]][0]
            val = [j for j, (s, _) in enumerate(val_members) if spec_key(s) == key]
            if len(idx) < self.min_members:
                self.models[key] = float(y[idx].mean())
                continue
            m = Metanet(spec, **self.options)
            tr = [members[i][1] for i in idx]
            if len(val) >= 2:
                m.fit(tr, y[idx], [val_members[j][1] for j in val], y_val[val], seed=seed)
            else:  # too few validation members: the last training ones validate
                m.fit(tr[:-2], y[idx][:-2], tr[-2:], y[idx][-2:], seed=seed)
            self.models[key] = m

    def predict(self, members) -> torch.Tensor:  # noqa: D102
        out = torch.zeros(len(members), dtype=torch.float64)
        for key, idx in _groups(members).items():
            if key not in self.models:
                raise WsymInputError("per-architecture meta-networks cannot read an unseen one")
            m = self.models[key]
            out[idx] = (
                torch.full((len(idx),), m, dtype=torch.float64)
                if isinstance(m, float)
                else m.predict([members[i][1] for i in idx]).double()
            )
        return out


def _groups(members) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, (spec, _) in enumerate(members):
        out.setdefault(spec_key(spec), []).append(i)
    return out
