"""The fine-tune experiment's out-of-distribution test set and training-loss band."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import finetune_sharpness as experiment  # noqa: E402

from wsym.zoo.tasks import load_task  # noqa: E402

MNIST1D = {
    "name": "mnist1d-patches", "seed": 1, "num_samples": 600, "patch": 4, "n_train": 200,
    "generator": {"iid_noise_scale": 0.05, "corr_noise_scale": 0.4, "shear_scale": 1.0},
    "label_map": [0, 1, 2, 3, 4, 0, 1, 2, 3, 4],
}  # fmt: skip
TOKENS = {
    "name": "markov-tokens", "seed": 1, "num_samples": 600, "vocab": 16, "length": 20,
    "topics": 10, "beta": 1.0, "concentration": 0.2, "language_seed": 0, "noise": 0.2,
    "n_train": 200, "label_map": [0, 1, 2, 3, 4, 0, 1, 2, 3, 4],
}  # fmt: skip


@pytest.mark.parametrize("dataset", [MNIST1D, TOKENS], ids=["mnist1d", "tokens"])
def test_the_shifted_test_set_is_the_same_task_further_shifted(dataset):
    x, y = experiment.shifted_test(dataset)
    own = load_task(dataset)
    assert x.shape[1:] == own.x_test.shape[1:] and x.dtype == own.x_test.dtype
    assert set(y.tolist()) == set(own.y_test.tolist()) == set(range(5))
    assert not torch.equal(x, own.x_test[: len(x)])  # fresh examples
    assert dataset["seed"] == 1  # the zoo's config is left as it was


def test_the_token_shift_doubles_the_noise():
    x, _ = experiment.shifted_test(TOKENS)
    clean = load_task({**TOKENS, "seed": 2, "noise": 0.0}).x_test
    half = load_task({**TOKENS, "seed": 2, "noise": 0.2}).x_test
    changed = (x != clean).double().mean()
    assert changed > 1.5 * (half != clean).double().mean()


def test_the_band_is_the_middle_half_of_training_losses():
    rows = [
        {"train_loss": i / 40, "gap": i / 40 + 0.01 * (i % 3), "ood_gap": i / 30, "m": float(i)}
        for i in range(40)
    ]
    text = experiment.shift_and_band(
        [r | {"ood_acc": 0.5, "test_error": 0.4} for r in rows], ["m"], boot=20
    )
    assert "band: 21 members" in text
    assert "| m | +1.000" in text  # tau(m, OOD gap) over all members
