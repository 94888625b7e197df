"""The command line (``dynatree ...``): typer commands in :mod:`dynatree.cli.main`, shared flags
and error handling in :mod:`dynatree.cli.common`. Importing it does not import torch."""

from dynatree.cli.main import app

__all__ = ["app"]
