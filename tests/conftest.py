import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from cases import BY_NAME  # noqa: E402

import wsym  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):  # two workers on two cores: one thread each
    torch.set_num_threads(1)

_SPECS: dict = {}


@pytest.fixture(scope="session")
def detected():
    """Detect each registry case once per session: name -> (model, inputs, spec)."""

    def get(name):
        if name not in _SPECS:
            case = BY_NAME[name]
            torch.manual_seed(0)
            model, inputs = case.build(), case.inputs()
            _SPECS[name] = (model, inputs, wsym.detect(model, inputs))
        return _SPECS[name]

    return get
