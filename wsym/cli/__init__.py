"""The ``wsym`` command line; the entry point is :func:`wsym.cli.main.main`."""
