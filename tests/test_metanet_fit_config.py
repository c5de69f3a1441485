"""``wsym.metanet.fit``'s hyperparameters as one value (FitConfig)."""

import pytest

from wsym.errors import WsymInputError
from wsym.metanet import FitConfig


def test_options_replace_config_fields():
    base = FitConfig(hidden=16)
    c = FitConfig.of(base, {"epochs": 0})
    assert (c.hidden, c.epochs, c.lr) == (16, 0, FitConfig().lr)
    assert FitConfig.of(None, {}) == FitConfig()


def test_unknown_option_is_named_with_a_suggestion():
    with pytest.raises(WsymInputError, match="no option epoch; did you mean epochs"):
        FitConfig.of(None, {"epoch": 3})
