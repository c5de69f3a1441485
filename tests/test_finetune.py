"""Pretrain-then-fine-tune zoos: schedule, smoothing, start point, resume, and the statistics."""

import math

import pytest
import torch
from torch.nn import functional as F

import wsym
import wsym.zoo
from wsym.errors import WsymInputError
from wsym.models.networks import TinyTransformer
from wsym.sharpness.correlation import calibrate_rho, kendall, partial_kendall, scramble
from wsym.zoo import finetune, pretrain
from wsym.zoo.presets import load_preset
from wsym.zoo.streams import example_loss
from wsym.zoo.tasks import IGNORE, load_task, markov_language


def toy(preset: str, samples: int, n_train: int, pretrain_steps: int, hyperparameters: dict):
    """Overrides shrinking a fine-tune preset to ``samples`` signals and a few steps."""
    base = load_preset(preset)
    return {
        "dataset": {**base["dataset"], "num_samples": samples, "n_train": n_train},
        "pretrain": {
            **base["pretrain"],
            "dataset": {**base["pretrain"]["dataset"], "num_samples": samples},
            "hyperparameters": {**base["pretrain"]["hyperparameters"], "steps": pretrain_steps},
        },
        "hyperparameters": hyperparameters,
    }


# the shipped preset at toy size: a few hundred signals, tens of steps
STEPS = {"steps": {"int_uniform": [5, 12]}, "batch_size": {"choice": [16, 32]}}
TINY = {**toy("vit-finetune", 500, 100, 30, STEPS), "shard_size": 2}


def test_learning_rate_is_linear_warmup_then_cosine():
    lr, warmup, total = torch.tensor([0.1, 0.2]), torch.tensor([4, 0]), torch.tensor([10, 5])
    for t in range(10):
        got = finetune.learning_rate(torch.tensor(t), lr, warmup, total)
        want = [0.1 * (t + 1) / 4 if t < 4 else 0.05 * (1 + math.cos(math.pi * (t - 4) / 6))]
        want.append(0.1 * (1 + math.cos(math.pi * min(t / 5, 1.0))))
        assert torch.allclose(got.double(), torch.tensor(want, dtype=torch.float64), atol=1e-7)


def test_label_smoothing_matches_torch_per_member():
    out, y = torch.randn(3, 5, 4, dtype=torch.float64), torch.randint(0, 4, (3, 5))
    eps = torch.tensor([0.0, 0.1, 0.3], dtype=torch.float64)
    got = example_loss(out, y, False, eps)
    for m in range(3):
        want = F.cross_entropy(out[m], y[m], reduction="none", label_smoothing=float(eps[m]))
        assert torch.allclose(got[m], want, atol=1e-12)


def test_mnist1d_patches_relabels_and_cuts():
    base = {"name": "mnist1d-patches", "seed": 0, "num_samples": 500, "n_train": 50}
    plain = load_task(base)
    mapped = load_task({**base, "label_map": [9 - d for d in range(10)]})
    assert plain.x_train.shape == (50, 10, 4) and plain.x_test.shape == (100, 10, 4)
    assert torch.equal(mapped.y_train, 9 - plain.y_train)
    shifted = load_task({**base, "generator": {"iid_noise_scale": 0.3}})
    assert not torch.equal(shifted.x_train, plain.x_train)
    with pytest.raises(WsymInputError, match="label_map"):
        load_task({**base, "label_map": [0, 1]})


def test_start_from_keeps_reinit_entries_and_refuses_mismatches():
    torch.manual_seed(0)
    source, target = TinyTransformer(dim=8, heads=2, depth=1), TinyTransformer(dim=8, heads=2)
    torch.manual_seed(1)
    target = TinyTransformer(dim=8, heads=2, depth=1)
    head = target.head.weight.clone()
    finetune.start_from(target, source.state_dict(), ["head"])
    assert torch.equal(target.pos, source.pos) and torch.equal(target.head.weight, head)
    with pytest.raises(WsymInputError, match="pretrain.reinit"):
        finetune.start_from(
            TinyTransformer(dim=8, heads=2, depth=1, classes=3), source.state_dict(), []
        )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("finetune")
    zoo = wsym.zoo.build("vit-finetune", members=3, out=out, progress=False, overrides=TINY)
    return out, zoo


def test_members_start_from_the_pretrained_model(tiny):
    out, _ = tiny
    slow = {"hyperparameters": {**TINY["hyperparameters"], "lr": 1e-12}}
    frozen = wsym.zoo.build(
        "vit-finetune", members=2, out=out / "frozen", progress=False, overrides={**TINY, **slow}
    )
    pretrained = (out / "frozen" / pretrain.PRETRAINED).read_bytes()
    state = wsym.zoo.store.decode_shard(pretrained, "pretrained")[0][-1]
    for member in frozen.ids:
        sd = frozen.state_dict(member)
        assert torch.allclose(sd["blocks.0.attn.q.weight"], state["blocks.0.attn.q.weight"])
        assert sd["head.weight"].shape == (5, 16) and state["head.weight"].shape == (10, 16)
    assert frozen.manifest["pretrained"]["steps"] == 30


def test_resume_reuses_the_pretrained_model_and_keeps_members(tiny):
    out, zoo = tiny
    before = (out / pretrain.PRETRAINED).read_bytes()
    again = wsym.zoo.build("vit-finetune", members=4, out=out, progress=False, overrides=TINY)
    assert (out / pretrain.PRETRAINED).read_bytes() == before
    for member in zoo.ids:
        for key, value in zoo.state_dict(member).items():
            assert torch.equal(again.state_dict(member)[key], value)
    rows = again.table
    assert {r["steps"] for r in rows} <= set(range(5, 13)) and len(rows) == 4


def test_kendall_and_partial_kendall():
    x, y = [1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 1.0, 4.0, 3.0, 5.0]
    z = [1.0, 3.0, 2.0, 5.0, 4.0]
    t = kendall(x, y, boot=300)
    assert t.tau == pytest.approx(0.6) and t.low <= t.tau <= t.high
    xy, xz, yz = 0.6, kendall(x, z, 1).tau, kendall(y, z, 1).tau
    want = (xy - xz * yz) / math.sqrt((1 - xz**2) * (1 - yz**2))
    assert partial_kendall(x, y, z, boot=50).tau == pytest.approx(want)
    assert math.isnan(partial_kendall(x, y, x, boot=50).tau)  # z orders x: undefined
    with pytest.raises(WsymInputError, match="at least 3"):
        kendall([1.0, 2.0], [2.0, 1.0])


def test_calibrate_rho_takes_the_grid_point_nearest_the_target():
    # median rho^2: 0.0025, 0.01, 0.04, 0.16 on 0.05 * 2^k; 0.16 is closest to 0.1 in log
    assert calibrate_rho(lambda rho: [rho**2] * 3, 0.1, 0.05) == pytest.approx(0.4)
    assert calibrate_rho(lambda rho: [rho] * 3, 0.1, 1.0) == pytest.approx(0.125)


def test_scramble_keeps_the_function_and_moves_the_weights():
    torch.manual_seed(0)
    model = TinyTransformer(dim=8, heads=2, depth=1, hidden=8, activation="gelu").double()
    x = torch.randn(4, 10, 4, dtype=torch.float64)
    spec = wsym.detect(model, x)
    moved = scramble(spec, model.state_dict(), seed=3)
    other = TinyTransformer(dim=8, heads=2, depth=1, hidden=8, activation="gelu").double()
    other.load_state_dict(moved)
    assert torch.allclose(other(x), model(x), atol=1e-9)
    assert (
        moved["blocks.0.attn.q.weight"] - model.state_dict()["blocks.0.attn.q.weight"]
    ).abs().max() > 1e-2


def test_masked_tokens_and_their_loss():
    task = {"name": "mnist1d-tokens", "num_samples": 500, "levels": 8, "mask": 0.25}
    data = load_task(task)
    plain = load_task({**task, "mask": None})
    hidden = data.y_train != IGNORE
    assert data.x_train.shape == (400, 20) and bool((hidden.sum(1) == 5).all())
    assert bool((data.x_train[hidden] == 8).all()) and int(plain.x_train.max()) == 7
    assert torch.equal(data.y_train[hidden], plain.x_train[hidden])
    out = torch.randn(2, 3, 20, 8, dtype=torch.float64)
    y = data.y_train[:6].view(2, 3, 20)
    got = example_loss(out, y, False)
    for m in range(2):
        for b in range(3):
            assert got[m, b] == pytest.approx(float(F.cross_entropy(out[m, b], y[m, b])))


def test_bert_preset_pretrains_by_masked_tokens(tmp_path):
    tiny = toy("bert-finetune", 300, 60, 10, {"steps": 3, "batch_size": 16})
    zoo = wsym.zoo.build("bert-finetune", members=2, out=tmp_path, progress=False, overrides=tiny)
    upstream = zoo.manifest["pretrained"]
    assert 0 <= upstream["test_acc"] <= 1 and upstream["steps"] == 10
    assert zoo.model(0).pool == "mean" and zoo.state_dict(0)["head.weight"].shape == (5, 16)


def test_markov_tokens_follow_their_topic_chains():
    options = {"vocab": 4, "length": 12, "topics": 3, "beta": 0.7, "concentration": 0.5}
    data = load_task({"name": "markov-tokens", "num_samples": 6000, "seed": 2, **options})
    chains = torch.from_numpy(markov_language(4, 3, 0.7, 0.5, seed=0))
    assert data.x_train.shape == (4800, 12) and data.x_test.shape == (1200, 12)
    for k in range(3):
        seqs = data.x_train[data.y_train == k]
        counts = torch.zeros(4, 4, dtype=torch.float64)
        pairs = (seqs[:, :-1].flatten(), seqs[:, 1:].flatten())
        counts.index_put_(pairs, torch.tensor(1.0, dtype=counts.dtype), accumulate=True)
        freq = counts / counts.sum(1, keepdim=True)
        assert torch.allclose(freq, chains[k], atol=0.03)
    # the label is the topic: the chains' likelihood recovers it far above chance
    logp = chains.log()[:, data.x_test[:, :-1], data.x_test[:, 1:]].sum(-1)
    assert float((logp.argmax(0) == data.y_test).double().mean()) > 0.7
    noisy = load_task({"name": "markov-tokens", "num_samples": 6000, "seed": 2, "noise": 1.0})
    assert abs(float(noisy.x_train.double().mean()) - 7.5) < 0.1  # uniform over 16 tokens
    masked = load_task({"name": "markov-tokens", "num_samples": 100, "mask": 0.25, **options})
    assert int(masked.x_train.max()) == 4 and bool(((masked.y_train != IGNORE).sum(1) == 3).all())
    with pytest.raises(WsymInputError, match="label_map"):
        load_task({"name": "markov-tokens", "num_samples": 100, "label_map": [0, 1]})
