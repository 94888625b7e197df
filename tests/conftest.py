"""Test-session setup that must happen before torch/triton are imported anywhere."""

import os

# Tests run on CPU: the Triton kernel is checked with Triton's interpreter. Triton reads this
# variable when it is first imported (transformers may import it early), so set it here.
os.environ.setdefault("TRITON_INTERPRET", "1")

# The test models are tiny: a second torch thread only waits at each op's barrier, and on a busy
# 2-core machine it spin-waits against other processes (a test file measured 4 min with 2 threads,
# 28 s with 1). So the suite runs single-threaded, the subprocesses it starts included.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The measured tree budget (dynatree.core.costmodel, opt-in) would time the tiny test models on the real
# clock and write profiles to the user's cache dir: off for the suite whatever the environment
# says; tests/core/test_costmodel.py switches it on per test with fake profiles and a temporary folder.
os.environ["DYNATREE_COST_MODEL"] = "off"

# A cached cost profile is re-timed once per process against the real clock (costmodel.holds):
# off for the suite, so that no test re-measures by timing; tests/core/test_costmodel.py drives
# the check with a fake clock and fake verdicts.
os.environ["DYNATREE_PROFILE_CHECK"] = "off"

# A greedy batch times its verify cost per tree share on the machine at first use: the suite reads
# the tuning table instead, so that no batch test's trees depend on the clock; tests/loop/test_batch.py
# drives the measured path with fake timings.
os.environ["DYNATREE_BATCH_SHARES"] = "table"

# The back-off to plain decoding (dynatree.loop.backoff) decides from the clock: off for the suite,
# so that no test's rounds depend on timing; tests/loop/test_backoff.py passes its own controllers.
os.environ["DYNATREE_BACKOFF"] = "off"

# The few-row linear kernels are chosen by timing them on this CPU at first use
# (dynatree.runtime.kernels.linear_plan): which path a test covers must not depend on the machine
# or its load, so the suite pins the layout tuned on the EPYC (row-major for 1-3 rows, packed
# weights from 4), the one that leaves F.linear the most: every exactness test covers it, the
# subprocesses the suite starts included. tests/runtime/kernels/test_linear_plan.py drives the
# measured choice with fake timings and runs a plan that mixes all three kernels end to end.
os.environ["DYNATREE_LINEAR_PLAN"] = "fixed"

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A tiny Llama target and a perturbed draft saved as HF folders with the chat-template
    tokenizer, for the CLI's ``--target`` and ``--draft``; one pair per test module. (Imported here,
    not at the top: this file must stay free of torch until the settings above are made.)"""
    from cli_helpers import save_pair
    from tiny import tiny_model
    from tiny_tok import VOCAB

    target, draft = save_pair(tmp_path_factory.mktemp("models"), tiny_model("llama", 0, vocab=VOCAB))
    return str(target), str(draft)


@pytest.fixture(scope="module")
def llama_pair():
    """The tiny Llama target and its partly agreeing draft (``tiny.llama_pair``), once per test module."""
    from tiny import llama_pair as make

    return make()
