"""A trained meta-network: its spec, graph schema, network and target scaling; save and read back.

A :class:`Predictor` maps state dicts of one architecture to predicted targets
(e.g. the generalization gap). It is invariant to the whole symmetry group of
that architecture: :func:`~wsym.metanet.invariant.invariant_form` removes the
continuous groups and signs, message passing over the weight graph the
permutations.

Files are one ``.safetensors`` holding the network's tensors, with the JSON
configuration (spec, architecture signature, hyperparameters, target scaling,
training report) in its metadata under ``"wsym.metanet"``.
"""

from __future__ import annotations

import os

import torch

from wsym.errors import WsymInputError, check_finite
from wsym.group.spec import SymmetrySpec
from wsym.metanet.files import write_file
from wsym.metanet.graph import GraphSchema, batch_graphs
from wsym.metanet.invariant import invariant_form
from wsym.metanet.layers import WeightGraphNet, stat_input
from wsym.metanet.novelty import TrainingDistribution

FORMAT = 3  # 2: per-tensor statistics in the readout; 3: statistics branch


def network_for(
    schema: GraphSchema,
    hidden: int,
    layers: int,
    outputs: int,
    stat_hidden: int = 64,
    members: int = 5,
    trees: int = 0,
    tree_depth: int = 3,
) -> WeightGraphNet:
    """A fresh :class:`WeightGraphNet` sized for ``schema``."""
    return WeightGraphNet(
        schema.num_node_types,
        schema.num_classes,
        schema.num_edge_types,
        schema.num_attr_types,
        schema.edge_width,
        schema.attr_width,
        schema.graph_width,
        schema.stat_width,
        hidden=hidden,
        layers=layers,
        outputs=outputs,
        stat_hidden=stat_hidden,
        members=members,
        trees=trees,
        tree_depth=tree_depth,
    )


class Predictor:
    """Predicts targets from state dicts of one architecture.

    Attributes:
        spec: the architecture's :class:`~wsym.group.spec.SymmetrySpec`.
        schema: its :class:`~wsym.metanet.graph.GraphSchema`.
        net: the :class:`~wsym.metanet.layers.WeightGraphNet`.
        config: hyperparameters, target names and scaling, training report.
    """

    def __init__(self, spec: SymmetrySpec, net: WeightGraphNet, config: dict):
        self.spec, self.net, self.config = spec, net, config
        self.schema = GraphSchema.from_spec(spec)
        self.net.eval()

    def graphs(self, state_dicts: list[dict]) -> list:
        """Invariant weight graphs of ``state_dicts`` (checked against the architecture)."""
        out = []
        for i, sd in enumerate(state_dicts):
            try:
                self.schema.check(sd)
            except WsymInputError as err:
                raise WsymInputError(f"state dict {i}: {err}") from None
            check_finite(sd, f"state dict {i}")
            out.append(self.schema.graph(invariant_form(sd, self.spec)))
        return out

    @torch.no_grad()
    def predict_graphs(self, graphs: list, batch_size: int = 64) -> torch.Tensor:
        """Predictions ``(n,)`` (or ``(n, targets)``) in target units, from prepared graphs."""
        self.net.eval()
        parts = [
            self.net(batch_graphs(graphs[i : i + batch_size]))
            for i in range(0, len(graphs), batch_size)
        ]
        y = torch.cat(parts).double() if parts else torch.zeros(0, len(self.config["targets"]))
        y = y * torch.tensor(self.config["target_std"]) + torch.tensor(self.config["target_mean"])
        return y[:, 0] if len(self.config["targets"]) == 1 else y

    def predict(self, state_dicts: list[dict] | dict) -> torch.Tensor:
        """Predicted targets for a list of state dicts (or one state dict).

        Raises:
            WsymInputError: a state dict of another architecture (missing entry or
                wrong shape), naming the mismatch.
        """
        single = isinstance(state_dicts, dict)
        y = self.predict_graphs(self.graphs([state_dicts] if single else list(state_dicts)))
        return y[0] if single else y

    def novelty(self, state_dict: dict) -> dict | None:
        """Whether ``state_dict`` lies outside the training members' weight statistics.

        ``{"out_of_distribution": bool, "distance", "threshold"}``
        (:class:`~wsym.metanet.novelty.TrainingDistribution`), or ``None`` for a file
        written before wsym stored those statistics (unknown).
        """
        dist = TrainingDistribution.from_json(self.config.get("novelty"))
        if dist is None:
            return None
        return dist.check(stat_input(batch_graphs(self.graphs([state_dict]))))

    def double(self) -> Predictor:
        """Run the network in float64 (for invariance checks at round-off level)."""
        self.net.double()
        return self

    def save(self, path: str | os.PathLike) -> None:
        """Write one ``.safetensors`` file (tensors + JSON config in the metadata)."""
        meta = {
            "format": FORMAT,
            "spec": self.spec.to_json(),
            "signature": self.schema.signature(),
            **self.config,
        }
        write_file(path, self.net, meta)


def from_config(config: dict, tensors: dict, path: str | os.PathLike = "") -> Predictor:
    """A :class:`Predictor` from a file's JSON config and tensors (see :func:`wsym.metanet.load`).

    Raises:
        WsymInputError: a file of another version of the meta-network.
    """
    fmt = config.get("format")
    spec = SymmetrySpec.from_json(config.pop("spec"))
    config.pop("signature", None)
    if config.pop("format", None) != FORMAT:
        raise WsymInputError(
            f"{path} was written by another version of wsym's meta-network (format "
            f"{fmt}, this wsym reads {FORMAT}); retrain it with `wsym metanet train`"
        )
    schema = GraphSchema.from_spec(spec)
    net = network_for(
        schema,
        config["hidden"],
        config["layers"],
        len(config["targets"]),
        config["stat_hidden"],
        config["members"],
        config.get("trees", 0),
        config.get("tree_depth", 3),
    )
    net.load_state_dict(tensors)
    return Predictor(spec, net, config)
