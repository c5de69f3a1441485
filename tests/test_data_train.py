import random

import numpy as np
import pytest
import torch
from torch import nn

from wsym.errors import WsymInputError
from wsym.io.datasets import load
from wsym.models.evaluate import evaluate
from wsym.models.networks import MLP, TinyTransformer
from wsym.models.train import train

SHAPES = {
    "mnist1d": ((4000, 40), (1000, 40)),
    "mnist1d-seq": ((4000, 10, 4), (1000, 10, 4)),
    "mnist1d-large": ((20000, 40), (5000, 40)),
    "digits": ((1437, 1, 8, 8), (360, 1, 8, 8)),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_shapes_and_dtypes(name):
    data = load(name)
    (train_shape, test_shape) = SHAPES[name]
    assert data.x_train.shape == train_shape and data.x_test.shape == test_shape
    assert data.y_train.shape == train_shape[:1] and data.y_test.shape == test_shape[:1]
    assert data.x_train.dtype == data.x_test.dtype == torch.float32
    assert data.y_train.dtype == data.y_test.dtype == torch.int64
    assert data.num_classes == 10
    assert set(data.y_train.tolist()) == set(range(10))
    assert torch.isfinite(data.x_train).all()


def test_seq_is_mnist1d_in_patches():
    flat, seq = load("mnist1d"), load("mnist1d-seq")
    assert torch.equal(seq.x_train.reshape(-1, 40), flat.x_train)
    assert torch.equal(seq.y_test, flat.y_test)


def test_digits_in_unit_interval_and_split_by_seed():
    a, b, c = load("digits", seed=0), load("digits", seed=0), load("digits", seed=1)
    assert a.x_train.min() >= 0 and a.x_train.max() <= 1
    assert torch.equal(a.x_train, b.x_train)
    assert not torch.equal(a.y_train, c.y_train)
    pooled = torch.cat([a.x_train, a.x_test]).flatten(1)
    assert torch.equal(pooled.sum(0), c.x_train.flatten(1).sum(0) + c.x_test.flatten(1).sum(0))


def test_load_returns_fresh_tensors_and_keeps_global_rng():
    state = random.getstate(), np.random.get_state()[1].copy()
    first = load("mnist1d", seed=3)
    assert random.getstate() == state[0]
    assert np.array_equal(np.random.get_state()[1], state[1])
    first.x_train.zero_()
    assert load("mnist1d", seed=3).x_train.abs().sum() > 0


def test_unknown_names():
    with pytest.raises(WsymInputError, match="unknown dataset .cifar10.; use one of mnist1d"):
        load("cifar10")
    with pytest.raises(WsymInputError, match="unknown split"):
        load("digits").batches("val")


def test_batches_cover_split_once():
    data = load("digits")
    batches = list(data.batches("test", 100, seed=0, shuffle=True))
    assert [len(y) for _, y in batches] == [100, 100, 100, 60]
    targets = torch.cat([y for _, y in batches])
    assert torch.equal(targets.sort().values, data.y_test.sort().values)
    again = torch.cat([y for _, y in data.batches("test", 100, seed=0, shuffle=True)])
    assert torch.equal(targets, again)
    in_order = torch.cat([y for _, y in data.batches("test", 100)])
    assert torch.equal(in_order, data.y_test)


def _mlp_run(seed):
    torch.manual_seed(seed)
    model = MLP(40, [64, 64], 10)
    result = train(model, load("mnist1d"), epochs=1, lr=0.1, batch_size=32, seed=seed)
    return model, result


def test_one_epoch_mlp_learns_mnist1d():
    _, result = _mlp_run(0)
    assert result["test_accuracy"] > 0.2
    assert result["steps"] == 125  # 4000 / 32


def test_same_seed_same_result():
    (model_a, result_a), (model_b, result_b) = _mlp_run(1), _mlp_run(1)
    assert result_a == result_b
    for p, q in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(p, q)
    _, result_c = _mlp_run(2)
    assert result_c != result_a


def test_adam_and_transformer_on_patches():
    torch.manual_seed(0)
    model = TinyTransformer(dim=16, heads=2, depth=1, hidden=32)
    result = train(model, load("mnist1d-seq"), epochs=1, lr=3e-3, optimizer="adam")
    assert np.isfinite(result["train_loss"]) and 0 <= result["test_accuracy"] <= 1


def test_evaluate_matches_direct_computation_and_restores_mode():
    data = load("digits")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10), nn.Dropout(0.5))
    loss, accuracy = evaluate(model, data.batches("test", 7))
    assert model.training
    model.eval()
    with torch.no_grad():
        logits = model(data.x_test)
    assert loss == pytest.approx(float(nn.functional.cross_entropy(logits, data.y_test)), rel=1e-5)
    assert accuracy == pytest.approx(float((logits.argmax(-1) == data.y_test).float().mean()))


def test_evaluate_follows_model_dtype():
    data = load("digits")
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10)).double()
    loss, _ = evaluate(model, data.batches("test", 64), loss_fn=nn.functional.cross_entropy)
    assert np.isfinite(loss)


def test_bad_optimizer():
    with pytest.raises(WsymInputError, match="unknown optimizer"):
        train(MLP(40, [8], 10), load("mnist1d"), epochs=1, lr=0.1, optimizer="lbfgs")
