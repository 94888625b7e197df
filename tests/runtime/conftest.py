"""Fixtures shared by the runtime tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dynatree.core.costmodel import ENV_DIR


@pytest.fixture(scope="module")
def private_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """A cache folder of the module's own (aot packages, cost profiles, kernel plans), set as
    ``DYNATREE_CACHE_DIR`` for the module and restored after: packages built here never mix with
    the user's or another module's."""
    folder: Path = tmp_path_factory.mktemp("cache")
    saved = os.environ.get(ENV_DIR)
    os.environ[ENV_DIR] = str(folder)
    yield folder
    if saved is None:
        os.environ.pop(ENV_DIR, None)
    else:
        os.environ[ENV_DIR] = saved
