"""Translations: constants that a softmax removes.

* Key bias: ``softmax(q (k + c)^T) = softmax(q k^T)`` because ``q c^T`` is the same
  for every key, so the key projection's bias is arbitrary (one vector per head).
* Logit bias: ``softmax(z + c 1) = softmax(z)``, so a uniform shift of the bias of
  a linear layer read only by a softmax/log-softmax changes nothing.

Both are found by walking back from the attention or softmax node through
operations that neither mix nor reuse values, to a linear layer with a bias.
"""

from __future__ import annotations

from dataclasses import replace

from wsym.detect.analyze import rule_name
from wsym.detect.rules.common import arg, is_tensor, norm_dim, shape
from wsym.group.kinds.translation import translation_size
from wsym.group.spec import Group, Leaf

PASS_THROUGH = {
    "aten::view",
    "aten::reshape",
    "aten::_unsafe_view",
    "aten::transpose",
    "aten::permute",
    "aten::unflatten",
    "aten::flatten",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::contiguous",
    "aten::clone",
    "aten::_to_copy",
    "aten::alias",
    "aten::unbind",
    "aten::select",
    "aten::split",
    "aten::split_with_sizes",
    "aten::chunk",
    "aten::slice",
    "aten::narrow",
    "_operator::getitem",
    "aten::dropout",
    "aten::expand",  # repeated key/value heads (written-out attention, a recorded matmul)
}
AXIS_PRESERVING = {
    "aten::contiguous",
    "aten::clone",
    "aten::_to_copy",
    "aten::alias",
    "aten::dropout",
}


# reshapes that keep the last axis (a recorded matmul or linear flattens the leading ones)
RESHAPES = {"aten::view", "aten::_unsafe_view", "aten::reshape"}
SEGMENT_OPS = {"_operator::getitem", "aten::select", "aten::slice", "aten::narrow"}


def _only_user(node, nxt) -> bool:
    """``nxt`` is the only reader of ``node``, or every reader takes a segment of it."""
    users = list(node.users)
    if users == [nxt]:
        return True
    return nxt in users and all(rule_name(u) in SEGMENT_OPS for u in users)


def _source(node, allowed, targets=("aten::linear",), masks=False) -> object | None:
    """The ``targets`` node feeding ``node`` through ``allowed`` ops, each read once.

    Multiplication by a number is allowed, so are reshapes that keep the last
    axis (the softmax axis), and with ``masks`` the addition of
    another tensor (an attention mask: constant along the softmax axis or not,
    it does not interact with a shift that is constant along it).
    """
    cur, nxt = node, None
    while True:
        if nxt is not None and not _only_user(cur, nxt):
            return None
        if cur.op != "call_function":
            return None
        name = rule_name(cur)
        if name in targets:
            return cur
        scalar_op = name in ("aten::mul", "aten::div") and not is_tensor(cur.args[1])
        mask_op = masks and name in ("aten::add", "aten::sub") and is_tensor(cur.args[0])
        last_kept = name in RESHAPES and shape(cur)[-1:] == shape(cur.args[0])[-1:]
        if name not in allowed and not scalar_op and not mask_op and not last_kept:
            return None
        cur, nxt = cur.args[0], cur


def _source_linear(node, allowed):
    """``(linear node, its bias)``: ``linear(x, W, b)``, ``addmm(b, x, W)`` or ``mm(x, W) + b``.

    ``addmm`` is GPT-2's Conv1D (and a recorded ``linear``); ``mm + b`` a recorded
    ``linear`` of a non-contiguous input.
    """
    lin = _source(node, allowed, targets=("aten::linear", "aten::addmm", "aten::add"))
    if lin is None:
        return None, None
    if rule_name(lin) == "aten::add":
        bias, product = lin.args[1], lin.args[0]
        while is_tensor(product) and rule_name(product) in RESHAPES:
            product = product.args[0]
        if not (is_tensor(product) and rule_name(product) == "aten::mm" and is_tensor(bias)):
            return None, None
        return lin, bias if len(shape(bias)) == 1 else None
    if rule_name(lin) == "aten::addmm":
        bias = lin.args[0]
        return lin, bias if is_tensor(bias) and len(shape(bias)) == 1 else None
    return lin, arg(lin, 2, "bias")


def _bias_leaves(layouts, key) -> list[Leaf]:
    from wsym.group.spec import leaves

    dims = dict(layouts)[key]
    return [leaf for t in dims for leaf in leaves(t)]


def translation_groups(ctx, st, traced, state_keys, layouts) -> list[Group]:
    """Key-bias and logit-bias translation candidates."""
    keys = [node.args[1] for node in ctx.attentions]
    for node, dim in ctx.softmaxes:  # softmax(q @ k^T ...) written out
        x = node.args[0]
        if norm_dim(dim, len(shape(x))) == len(shape(x)) - 1:
            mm = _source(x, AXIS_PRESERVING, targets=("aten::matmul", "aten::bmm"), masks=True)
            if mm is not None and len(shape(mm.args[1])) >= 2:
                keys.append(mm.args[1])
    groups = []
    for k in keys:
        _, bias = _source_linear(k, PASS_THROUGH)
        if not is_tensor(bias) or bias.name not in state_keys:
            continue
        signature = set()
        for dim in ctx.layouts[k.name]:
            for a in ctx._atoms_of(dim):
                signature.update((r, p) for _, r, p in st.leaves(a))
        key = state_keys[bias.name]
        target = [
            leaf for leaf in _bias_leaves(layouts, key) if (leaf.cls, leaf.parity) in signature
        ]
        if target:
            group = Group(
                "translation", 0, 1, (key,), target=(key, tuple(sorted(signature)), "full")
            )
            size = translation_size(group, dict(layouts)[key])
            groups.append(replace(group, size=size))
    for node, dim in ctx.softmaxes:
        x = node.args[0]
        if norm_dim(dim, len(shape(x))) != len(shape(x)) - 1:
            continue
        _, bias = _source_linear(x, AXIS_PRESERVING)
        if not is_tensor(bias) or bias.name not in state_keys:
            continue
        key = state_keys[bias.name]
        sig = tuple(sorted({(leaf.cls, leaf.parity) for leaf in _bias_leaves(layouts, key)}))
        groups.append(Group("translation", 1, 1, (key,), target=(key, sig, "uniform")))
    return groups
