"""Canonicalize, align and merge checkpoints modulo their symmetries.

:mod:`~wsym.align.canonicalize` (canonical forms), :mod:`~wsym.align.matching` and
:mod:`~wsym.align.assignment` (weight matching), :mod:`~wsym.align.activations`
(activation matching), :mod:`~wsym.align.continuous` (continuous groups fitted to a
reference), :mod:`~wsym.align.alignment` (:func:`wsym.align`), :mod:`~wsym.align.merge`,
:mod:`~wsym.align.interpolate` (loss along the segment) and :mod:`~wsym.align.repair`.
"""
