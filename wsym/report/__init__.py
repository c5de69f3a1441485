"""The main job's report: every capability of wsym run on one zoo, as HTML and JSON."""

from wsym.report.pipeline import report

__all__ = ["report"]
