"""Loading a trained draft from its folder (config + safetensors), whichever kind it is.

Apart from :mod:`dynatree.drafts.distilled` (the independent draft) and
:mod:`dynatree.drafts.feature_head` (which builds on it) because loading must know both kinds.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from dynatree.drafts.distilled import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    DistilledDraft,
    DraftConfig,
    TargetFingerprint,
    default_draft_path,
)
from dynatree.drafts.feature_head import FeatureDraft
from dynatree.errors import DynaTreeError, first_line


def load_distilled_draft(target: nn.Module, path: str | os.PathLike[str] | None = None
                         ) -> DistilledDraft:
    """Build a draft around ``target``'s embedding (shared) and load trained weights.

    ``path`` defaults to the draft shipped for SmolLM2-135M-Instruct. Raises
    :class:`DynaTreeError` when the files are missing or were trained against another target.
    """
    folder = Path(path) if path is not None else default_draft_path()
    cfg_file, weights_file = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not cfg_file.is_file() or not weights_file.is_file():
        raise DynaTreeError(f"no distilled draft in {folder} (need {CONFIG_FILE} and {WEIGHTS_FILE})")
    try:
        cfg = DraftConfig.from_json(cfg_file.read_text(encoding="utf-8"))
    except (ValueError, KeyError, TypeError) as err:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        raise DynaTreeError(f"{cfg_file} is not a valid draft config ({err}); {_restore_hint(folder)}") from err
    embedding = target.get_input_embeddings()
    got = TargetFingerprint.of(embedding.weight)
    if not cfg.fingerprint.matches(got):
        raise DynaTreeError(
            f"the draft in {folder} was distilled for target '{cfg.target_name}' (embedding "
            f"{cfg.fingerprint.shape[0]}x{cfg.fingerprint.shape[1]}); the given "
            f"{type(target).__name__} (embedding {got.shape[0]}x{got.shape[1]}) is a different "
            "model")
    draft = draft_class(cfg.kind)(cfg, embedding)
    try:
        state = load_file(str(weights_file))
    except (SafetensorError, OSError) as err:  # a truncated copy, a damaged header, an unreadable file
        raise DynaTreeError(f"cannot read the draft weights {weights_file} ({first_line(err)}): the file is "
                            f"truncated or damaged; {_restore_hint(folder)}") from None
    expected = set(draft.trainable_state_dict())
    if set(state) != expected:
        raise DynaTreeError(f"{weights_file} holds tensors {sorted(set(state) ^ expected)[:4]} "
                            f"that do not match its config; {_restore_hint(folder)}")
    try:
        draft.load_state_dict(state, strict=False)
    except RuntimeError as err:  # torch lists every mismatched shape on its own line
        raise DynaTreeError(f"{weights_file} holds tensors whose shapes do not match its config "
                            f"({first_line(err)}); {_restore_hint(folder)}") from None
    return draft.to(dtype=embedding.weight.dtype).eval()


def _restore_hint(folder: Path) -> str:
    """How to get intact draft files back: a draft shipped in the package comes back with the
    package; one the user distilled, by distilling (or copying) it again."""
    package = Path(str(resources.files("dynatree"))).resolve()
    if folder.resolve().is_relative_to(package):
        return "reinstall dynatree (pip install --force-reinstall --no-deps dynatree)"
    return f"distil the draft again (dynatree distill) or copy {folder} again"


def draft_class(kind: str) -> type[DistilledDraft]:
    """The module class of a draft ``kind`` (see :attr:`DraftConfig.kind`)."""
    if kind == "feature":
        return FeatureDraft
    return DistilledDraft
