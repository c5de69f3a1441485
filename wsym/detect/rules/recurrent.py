"""Rules for recurrent layers: ``aten::lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``.

Each layer (and direction) has ``H`` hidden units. Unit ``j`` owns row ``j`` of
every gate block of ``W_ih``, ``W_hh``, ``b_ih``, ``b_hh`` (gates stacked as
``(i, f, g, o)``, ``(r, z, n)`` or one block), column ``j`` of ``W_hh``, feature
``j`` of the layer's output and of its states, and column ``j`` of the next
layer's ``W_ih``. What acts on the units:

* permutations, always (the gates permute alike);
* signs where the unit's state is odd in its pre-activations: a tanh RNN
  (``h = tanh(.)``: every row flips), a GRU (``h' = (1 - z) n + z h`` with
  ``n = tanh(.)``: the ``n`` rows flip, ``r`` and ``z`` only see flipped
  columns), an LSTM (``c' = f c + i g``, ``h = o tanh(c)``: the ``g`` rows flip,
  and so do the cell state ``c`` and ``h``);
* positive scales for a ReLU RNN (rows by ``s``, ``W_hh``'s columns by ``1/s``);
* nothing continuous (the gates are nonlinear).

The input features are contracted with ``W_ih``'s columns as by a linear map.
Initial states must be zeros (the default) or move with the units; the stacked
final states of several layers are read as one axis only when one layer runs.
"""

from __future__ import annotations

from wsym.detect.context import Context
from wsym.detect.rules.common import NONLINEAR, arg, shape
from wsym.detect.rules.shape import is_zero

# op -> (number of gate blocks, which blocks flip with the unit, scales pass)
CELLS = {
    "aten::lstm": (4, (2,), False),
    "aten::gru": (3, (2,), False),
    "aten::rnn_tanh": (1, (0,), False),
    "aten::rnn_relu": (1, (), True),
}


def recurrent(ctx: Context, node) -> None:
    """Couple a recurrent layer's units (see the module docstring).

    Arguments: ``(x, hx, params, has_biases, layers, dropout, train, bidirectional,
    batch_first)``.
    """
    name = node.target._schema.name
    x, hx, params = node.args[0], node.args[1], node.args[2]
    biases, layers, bidirectional = node.args[3], node.args[4], node.args[7]
    batch_first = arg(node, 8, "batch_first", False)
    dirs = 2 if bidirectional else 1
    per = 4 if biases else 2
    if len(params) != layers * dirs * per:
        raise ValueError("projections (proj_size) are not read")
    gates, odd, scales = CELLS[name]
    sc, sg = ("eq" if scales else "zero"), ("eq" if odd else "zero")
    lx = ctx.layouts[x.name]
    feature = lx[-1]
    every = []
    for layer in range(layers):
        units = [
            _unit(ctx, params[(layer * dirs + d) * per :][:per], feature, gates, odd, sc)
            for d in range(dirs)
        ]
        every += units
        feature = units[0] if dirs == 1 else [ctx.concat(units)]
    out = ctx.like(lx[:-1]) + ctx.fresh(tuple(node.meta["val"][0].shape[-1:]))
    for do, dx in zip(out[:-1], lx[:-1], strict=True):
        ctx.couple(do, dx, scale="zero", sign="zero", breaks=NONLINEAR)
    ctx.couple(out[-1], feature, scale=sc, sign=sg, breaks=NONLINEAR)
    single = layers * dirs == 1
    batch = [lx[0 if batch_first else 1]] if len(lx) == 3 else []
    states = [_state(ctx, t, units, batch, single, sc, sg) for t in node.meta["val"][1:]]
    for h0 in hx if isinstance(hx, list | tuple) else [hx]:
        if not is_zero(h0):
            if single:
                _couple_state(ctx, ctx.layouts[h0.name], units, batch, sc, sg)
            else:
                _block(ctx, every, "initial states of a multi-layer recurrent layer")
    if not single and _reads_states(node):
        _block(ctx, every, "final states of a multi-layer recurrent layer")
    ctx.layouts[node.name] = [out, *states]


def _unit(ctx: Context, params, feature, gates: int, odd, sc: str) -> list:
    """Couple one layer's parameters to a new hidden-unit atom; return its dim."""
    w_ih, w_hh = params[0], params[1]
    size = shape(w_hh)[1]
    hid = [ctx.new(size)] if size > 1 else []
    ctx.mark(hid, *NONLINEAR)
    ctx.couple(ctx.layouts[w_ih.name][1], feature, parity=1)
    ctx.event([ctx.layouts[w_ih.name][1], feature], [ctx.layouts[w_ih.name]])
    ctx.couple(ctx.layouts[w_hh.name][1], hid, parity=1, scale=sc, breaks=NONLINEAR)
    for p in params:
        rows = ctx.layouts[p.name][0]
        for k in range(gates):
            seg = ctx.segment(rows, k * size, (k + 1) * size)
            ctx.couple(seg, hid, scale=sc, sign=None, breaks=NONLINEAR)
            if k in odd:
                ctx.relate("sign", [seg, hid], (1, -1))
            else:
                ctx.relate("sign", [seg], (1,))
    return hid


def _state(ctx: Context, val, units, batch, single: bool, sc: str, sg: str):
    """Layout of a final state (``h_n``, ``c_n``)."""
    if not single:
        return ctx.fresh(tuple(val.shape), "final states of a multi-layer recurrent layer")
    lay = ctx.fresh(tuple(val.shape))
    _couple_state(ctx, lay, units, batch, sc, sg)
    return lay


def _couple_state(ctx: Context, lay, units, batch, sc: str, sg: str) -> None:
    """A ``(layers * dirs, [B,] H)`` state of a one-layer recurrence moves with its units."""
    if batch:
        ctx.couple(lay[1], batch[0], scale="zero", sign="zero", breaks=NONLINEAR)
    ctx.couple(lay[-1], units[0], scale=sc, sign=sg, breaks=NONLINEAR)


def _block(ctx: Context, units, reason: str) -> None:
    for hid in units:
        ctx.block_dim(hid, reason)


def _reads_states(node) -> bool:
    return any(u.args[1] > 0 and u.users for u in node.users)


RULES = {name: recurrent for name in CELLS}
