"""`python -m dynatree` runs the command line."""

from dynatree.cli import app

app()
