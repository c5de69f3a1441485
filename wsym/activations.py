"""Running a traced model at a given state dict and reading intermediate activations."""

from __future__ import annotations

import torch

from wsym.errors import WsymInputError
from wsym.graph.trace import model_inputs, trace


class _Capture(torch.fx.Interpreter):
    def __init__(self, gm, wanted: set[str]):
        super().__init__(gm)
        self.wanted, self.seen = wanted, {}

    def run_node(self, n):
        out = super().run_node(n)
        if n.name in self.wanted:
            self.seen[n.name] = out
        return out


def site_activations(model: torch.nn.Module, state_dict: dict, batches, sites) -> dict:
    """``{(node, dim): (samples, units)}`` float64 activations over all ``batches``.

    The model is traced on the first batch; every other axis of a site counts as
    samples (batch, positions, and feature axes of canonicalized blocks).
    """
    batches = list(batches)
    if not batches:
        raise WsymInputError(
            "no batches given for activation matching; pass a few (inputs, targets)"
        )
    traced = trace(model, batches[0][0])
    if traced.program is None:
        raise WsymInputError(
            "activation matching needs a model torch.export can trace; use method='weights'"
        )
    gm = traced.program.module()
    params = {k: v for k, v in state_dict.items() if v.is_floating_point()}
    gm = gm.to(torch.float64)
    gm.load_state_dict({k: v.to(torch.float64) for k, v in params.items()}, strict=False)
    wanted = {node for node, _ in sites}
    out: dict = {site: [] for site in sites}
    with torch.no_grad():
        for inputs, _ in batches:
            args, kwargs = model_inputs(model, inputs)
            args = tuple(
                a.double() if torch.is_tensor(a) and a.is_floating_point() else a for a in args
            )
            interp = _Capture(gm, wanted)
            interp.run(*args, *kwargs.values())
            for node, d in sites:
                x = interp.seen[node]
                out[(node, d)].append(x.movedim(d, -1).reshape(-1, x.shape[d]).double())
    return {site: torch.cat(v) for site, v in out.items()}
