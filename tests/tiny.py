"""Tiny random models of the four architectures the engine must support, built in-process.

``initializer_range`` is large so the random models have peaked next-token distributions (like
real LMs): a uniform-ish random model would make every tree collapse to its root under probability
pruning and the exactness tests would exercise nothing deeper.
"""

from __future__ import annotations

import copy

import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

ARCHS = ("llama", "gpt2", "neox", "qwen2")

# Small trees with siblings and several levels: every strategy exercises branching and depth while
# the exactness-style tests stay fast.
SMALL_TREES: dict[str, dict] = {
    "linear": {"k": 4},
    "fixed": {"depth": 4, "branch": 2, "tau": 0.0, "max_nodes": 24},
    "dynatree": {"tau": 0.0, "d0": 3, "d_max": 5, "max_nodes": 24, "window": 2},
    "dyspec": {"max_nodes": 24},
    "dyspec-threshold": {"threshold": 0.01, "max_nodes": 24},
}
#: Sliding-window targets: every layer (Mistral), interleaved with full layers through
#: ``layer_types`` (Gemma 3), and Qwen2's ``use_sliding_window`` above ``max_window_layers``.
WINDOW_ARCHS = ("mistral", "gemma3", "qwen2-sw")
VOCAB = 96


def tiny_model(arch: str, seed: int = 0, *, vocab: int = VOCAB, attn: str = "sdpa", layers: int = 2,
               init: float = 0.5, max_positions: int = 1024) -> torch.nn.Module:
    """A tiny fp32 causal LM of ``arch`` in eval mode."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, initializer_range=init, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    if arch == "llama":
        cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=max_positions, **common)
        cls = LlamaForCausalLM
    elif arch == "qwen2":
        cfg = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=max_positions, **common)
        cls = Qwen2ForCausalLM
    elif arch == "neox":
        cfg = GPTNeoXConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                            max_position_embeddings=max_positions, rotary_pct=0.5, **common)
        cls = GPTNeoXForCausalLM
    elif arch in WINDOW_ARCHS:
        return window_model(arch, seed, vocab=vocab, attn=attn, init=init, max_positions=max_positions)
    elif arch == "gpt2":
        cfg = GPT2Config(n_embd=32, n_layer=layers, n_head=4, n_positions=max_positions, **common)
        cls = GPT2LMHeadModel
    else:
        raise ValueError(arch)
    cfg._attn_implementation = attn
    return cls(cfg).eval()


def window_model(arch: str, seed: int = 0, *, window: int = 6, vocab: int = VOCAB, attn: str = "sdpa",
                 init: float = 0.5, max_positions: int = 1024) -> torch.nn.Module:
    """A tiny sliding-window target whose ``window`` is far shorter than the texts the tests generate."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, initializer_range=init, bos_token_id=0, eos_token_id=1, pad_token_id=0,
                  hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=max_positions, sliding_window=window)
    if arch == "mistral":
        cfg, cls = MistralConfig(num_hidden_layers=2, **common), MistralForCausalLM
    elif arch == "gemma3":
        cfg = Gemma3TextConfig(num_hidden_layers=4, head_dim=8, query_pre_attn_scalar=8, tie_word_embeddings=False,
                               layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                            "sliding_attention"], **common)
        cls = Gemma3ForCausalLM
    elif arch == "qwen2-sw":
        cfg = Qwen2Config(num_hidden_layers=3, use_sliding_window=True, max_window_layers=1, **common)
        cls = Qwen2ForCausalLM
    else:
        raise ValueError(arch)
    cfg._attn_implementation = attn
    return cls(cfg).eval()


def perturbed(model: torch.nn.Module, noise: float = 0.03, seed: int = 123) -> torch.nn.Module:
    """A copy of ``model`` with Gaussian noise on every weight: a draft that agrees only partly."""
    torch.manual_seed(seed)
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn_like(p) * noise * (p.std() if p.numel() > 1 else 1.0))
    return out.eval()


def llama_pair(noise: float = 0.05) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The tiny Llama target (seed 0) and a draft that agrees with it only partly."""
    target = tiny_model("llama", seed=0)
    return target, perturbed(target, noise=noise)


def hf_greedy(model: torch.nn.Module, ids: torch.Tensor, max_new_tokens: int, eos=None) -> torch.Tensor:
    """Reference: HF generate, greedy, with EOS stopping only when ``eos`` is given. The explicit
    attention mask matters: without it HF masks every prompt token equal to the pad id (0)."""
    return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                          eos_token_id=eos, pad_token_id=0, min_new_tokens=0)


def lazy_head_kernels(monkeypatch, head: torch.Tensor) -> list[tuple[bool, str]]:
    """Spy: each few-row kernel call as (a call of the lazy head on ``head``, its kernel)."""
    from dynatree.runtime.cache import CachedModel
    from dynatree.runtime.kernels import cpu_linear

    seen: list[tuple[bool, str]] = []
    inside = [False]
    real, real_head = cpu_linear.small_batch_linear, CachedModel.apply_head

    def spy(x, w, b=None, kernel="rowmajor"):
        seen.append((inside[0] and w is head, kernel))
        return real(x, w, b, kernel)

    def lazy_head(self, hidden):
        inside[0] = True
        try:
            return real_head(self, hidden)
        finally:
            inside[0] = False

    monkeypatch.setattr(cpu_linear, "small_batch_linear", spy)
    monkeypatch.setattr(CachedModel, "apply_head", lazy_head)
    return seen
