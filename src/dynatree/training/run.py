"""What ``dynatree distill`` runs: load the target, then train the draft kind the config names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dynatree.loading.models import load_model
from dynatree.training.config import DistillConfig
from dynatree.training.distill import distill
from dynatree.training.features import distill_features


def distill_with_target(target: str, cfg: DistillConfig, *, out: Path, resume: bool = True,
                        device: str = "cpu", progress: bool = True) -> tuple[Path, dict[str, Any]]:
    """Load ``target`` (a preset, path or hub id) on ``device`` and run :func:`distill`; returns the
    final folder and its held-out metrics. What ``dynatree distill`` runs."""
    model, tokenizer = load_model(target, device=device)  # checks the device first (one-line errors)
    train = distill_features if cfg.kind == "feature" else distill

    final = train(model, tokenizer, out_dir=out, config=cfg, target_name=target, resume=resume, progress=progress)
    return final, json.loads((final / "metrics.json").read_text())["eval"]
