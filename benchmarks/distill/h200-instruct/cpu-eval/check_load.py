"""The instruct draft loads from a folder and speculates exactly: linear K=4 output == autoregressive.

    python benchmarks/distill/h200-instruct/cpu-eval/check_load.py --draft /tmp/instruct-draft \
        --out benchmarks/distill/h200-instruct/cpu-eval/check_load.json

The folder needs ``config.json`` and ``model.safetensors`` (the H200 run's ``draft_config.json``
renamed, its two weight shards joined by ``python benchmarks/distill/gpu_instruct.py --join FOLDER``).
Two prompts (a prose start and a chat-templated request), 32 new tokens, no EOS stop, with and
without the back-off; both the shipped draft and the given one. Speeds are left out on purpose.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import torch

import dynatree
from dynatree.drafts.checkpoint import load_distilled_draft
from dynatree.loading.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    target, tok = load_model("smollm2-135m")
    prompts = {
        "prose": "The history of the printing press",
        "chat": tok.apply_chat_template([{"role": "user", "content": "Explain what a hash table is in two sentences."}],
                                        tokenize=False, add_generation_prompt=True),
    }
    stop = dynatree.StoppingConfig(eos_token_id=())
    res: dict = {}
    for name, folder in (("shipped", None), ("instruct", args.draft)):
        draft = load_distilled_draft(target, folder)
        res[name] = {}
        for pname, text in prompts.items():
            ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids
            with warnings.catch_warnings():
                warnings.simplefilter("error", DeprecationWarning)  # the typed groups only
                ar = dynatree.generate(target, None, ids, "autoregressive", max_new_tokens=32, stopping=stop)
                for backoff in (True, False):
                    sp = dynatree.generate(target, draft, ids, "linear:k=4", max_new_tokens=32, stopping=stop,
                                           backoff=backoff)
                    s = sp.stats.summary()
                    row = {"equal_to_autoregressive": torch.equal(ar.sequences, sp.sequences),
                           **{k: s[k] for k in ("new_tokens", "rounds", "mean_committed", "mean_drafted", "acceptance")}}
                    res[name][f"{pname}, backoff={backoff}"] = row
                    print(name, pname, backoff, row, flush=True)
    args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
