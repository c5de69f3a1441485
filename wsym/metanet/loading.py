"""Reading a meta-network file back: a one-architecture or a park predictor, by its format."""

from __future__ import annotations

import os

from wsym.metanet import park, predictor
from wsym.metanet.files import read_file


def load(path: str | os.PathLike) -> predictor.Predictor | park.ParkPredictor:
    """Read a predictor written by :meth:`Predictor.save` or :meth:`ParkPredictor.save`.

    Raises:
        WsymInputError: missing file, not a wsym meta-network file, or another version's.
    """
    config, tensors = read_file(path)
    if config.get("format") == park.PARK_FORMAT:  # one network for many architectures
        return park.from_config(config, tensors)
    return predictor.from_config(config, tensors, path)
