"""The report's fine-tune section: on the shipped zoo, scrambling changes no invariant measure."""

import pytest

import wsym.zoo
from wsym.report import finetune
from wsym.report.document import Document
from wsym.report.run import ReportRun

pytestmark = pytest.mark.skipif(
    not (finetune.FINETUNE_ZOO / "manifest.json").is_file(), reason="needs data/zoos/vit-finetune"
)


def test_section_keeps_invariant_measures_and_moves_the_others():
    zoo = wsym.zoo.load(finetune.FINETUNE_ZOO)
    ctx = ReportRun(zoo=zoo, spec=None, quick=True, progress=False)
    doc = Document("t")
    numbers = finetune.section(ctx, doc)
    assert len(numbers["members"]) == finetune.QUICK_MEMBERS
    taus = numbers["kendall"]
    for m in ("geodesic-inv", "geodesic-mix"):  # functions of the function: unchanged
        assert taus[m]["max_relative_change"] < 1e-4, m  # round-off of the ascent only
        assert taus[m]["after"] == taus[m]["before"], m
    for m in ("euclidean", "hessian-trace", "adaptive"):  # GL moves them
        assert taus[m]["max_relative_change"] > 1e-2, m
    assert max(r["drift"] for r in numbers["rows"]) < 1e-8
    assert "scramble" in doc.render()


def test_section_without_the_zoo_says_how_to_build_it(tmp_path):
    doc = Document("t")
    ctx = ReportRun(zoo=None, spec=None, quick=True, progress=False)
    assert finetune.section(ctx, doc, tmp_path / "none") == {}
    assert "wsym zoo build --preset vit-finetune" in doc.render()
