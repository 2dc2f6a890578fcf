"""Build a tiny Llama, its tokenizer, a smaller draft Llama and an EAGLE-1 head, with no download.

Usage (with the e2e venv's python): build_model.py MODELS_DIR
Builds, unless already there, MODELS_DIR/<hash of this file>/ (model_cache.py):
target/ (model + tokenizer), draft/ (a 1-layer Llama on the same tokenizer, for
vLLM's draft_model method), eagle/ (the head) and .built. Everything is seeded; on
one thread it takes about a minute.

The corpus is generated, repetitive text, so a target trained for seconds writes
fluent-looking loops (ngram drafting finds matches in them) and a head trained for
seconds against it guesses the next token well and later ones worse: the realistic
fall-off by position that the e2e test checks. The draft model is the target's recipe,
smaller: trained on the same corpus, it agrees with the target on most tokens.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import time
from pathlib import Path

import torch
from model_cache import model_dir
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SEED = 1234
HIDDEN, LAYERS, HEADS, INTERMEDIATE = 128, 2, 2, 384
DRAFT_LAYERS = 1  # the draft: hidden 128 too, one layer
SEQ = 64
TARGET_STEPS, DRAFT_STEPS, EAGLE_STEPS = 220, 220, 260
SPECIALS = ["<unk>", "<s>", "</s>"]

SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the robot", "a small bird", "the teacher", "our neighbour"]
VERBS = ["sees", "likes", "finds", "paints", "follows", "carries", "watches", "remembers"]
OBJECTS = ["the red ball", "a green box", "the blue door", "a long road", "the quiet river", "an empty cup",
           "the tall tree", "a bright star"]
PLACES = ["in the morning", "at night", "near the house", "by the sea", "after lunch", "in the garden"]


def corpus(n: int, rng: random.Random) -> list[str]:
    # Few templates, strongly repeated: patterns a tiny model learns in seconds.
    lines = []
    for _ in range(n):
        s, v, o, p = rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(PLACES)
        lines.append(rng.choice([f"{s} {v} {o} {p} .", f"{p} , {s} {v} {o} .", f"{s} {v} {o} and {s} {v} {o} again ."]))
    return lines


def build_tokenizer(lines: list[str], out: Path) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIALS,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   model_max_length=512)
    fast.save_pretrained(out)
    return fast


def batches(ids: list[int], rng: random.Random, batch: int):
    while True:
        starts = [rng.randrange(0, len(ids) - SEQ - 2) for _ in range(batch)]
        yield torch.tensor([ids[s:s + SEQ + 2] for s in starts])


def train_llama(tok: PreTrainedTokenizerFast, ids: list[int], rng: random.Random, out: Path, name: str,
                layers: int, steps: int) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                      num_hidden_layers=layers, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                      max_position_embeddings=512, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      tie_word_embeddings=False, torch_dtype="float32")
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = batches(ids, rng, 16)
    for _ in range(steps):
        x = next(data)[:, :SEQ]
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M params, loss {loss.item():.3f}")
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    return model


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, theta: float):
    # Llama's rotate-half RoPE over the last dim, positions 0..T-1.
    t, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.outer(torch.arange(t, dtype=torch.float32), inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class EagleHead(nn.Module):
    """vLLM's EAGLE-1 Llama head (llama_eagle.py): fc over [embed(next token); target hidden],
    one decoder layer without its input norm, no final norm, the target's lm_head."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        h, self.heads, self.theta = cfg.hidden_size, cfg.num_attention_heads, cfg.rope_parameters["rope_theta"]
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(h, h, bias=False) for _ in range(4))
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)

    def forward(self, embeds, hidden):
        x = self.fc(torch.cat([embeds, hidden], -1))
        b, t, h = x.shape
        split = lambda p: p(x).view(b, t, self.heads, h // self.heads).transpose(1, 2)
        q, k, v = rope(split(self.q_proj), self.theta), rope(split(self.k_proj), self.theta), split(self.v_proj)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, h))
        n = self.post_attention_layernorm(x)
        return x + self.down_proj(torch.nn.functional.silu(self.gate_proj(n)) * self.up_proj(n))

    def vllm_state_dict(self) -> dict[str, torch.Tensor]:
        # The names of an EAGLE-1 checkpoint (vLLM prefixes "model." itself); embed_tokens
        # and lm_head are shared with the target, as in the published EAGLE heads.
        s = self.state_dict()
        names = {"fc.weight": "fc.weight", "post_attention_layernorm.weight": "layers.0.post_attention_layernorm.weight"}
        names |= {f"{p}.weight": f"layers.0.self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
        names |= {f"{p}.weight": f"layers.0.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}
        return {names[k]: v.contiguous() for k, v in s.items()}


def train_eagle(target: LlamaForCausalLM, ids: list[int], rng: random.Random, out: Path) -> None:
    cfg = target.config
    head = EagleHead(cfg)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    data = batches(ids, rng, 16)
    for _ in range(EAGLE_STEPS):
        x = next(data)
        with torch.no_grad():
            h = target.model(input_ids=x[:, :SEQ + 1]).last_hidden_state  # post-norm, as vLLM passes it
            hidden, want = h[:, :SEQ], lm_head(h[:, 1:]).argmax(-1)  # the target's greedy choice
        # Position t sees [embed(x[t+1]); hidden(t)] and predicts what the target says after x[t+1].
        logits = lm_head(head(embed(x[:, 1:SEQ + 1]), hidden))
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), want.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"eagle head: loss {loss.item():.3f}")
    out.mkdir(parents=True, exist_ok=True)
    save_file(head.vllm_state_dict(), str(out / "model.safetensors"))
    eagle_cfg = cfg.to_dict() | {"num_hidden_layers": 1, "architectures": ["LlamaForCausalLM"]}
    (out / "config.json").write_text(json.dumps(eagle_cfg, indent=1))


def main() -> int:
    final = model_dir(Path(sys.argv[1]))
    if (final / ".built").exists():
        print(f"{final} is already built")
        return 0
    out = final.with_suffix(".tmp")
    shutil.rmtree(out, ignore_errors=True)
    started = time.monotonic()
    torch.manual_seed(SEED)
    torch.set_num_threads(1)  # two threads were ~8x slower on the shared cores
    rng = random.Random(SEED)
    lines = corpus(6000, rng)
    target_dir = out / "target"
    tok = build_tokenizer(lines, target_dir)
    ids = tok("\n".join(lines), verbose=False)["input_ids"]
    print(f"tokenizer: {time.monotonic() - started:.1f} s")
    target = train_llama(tok, ids, rng, target_dir, "target", LAYERS, TARGET_STEPS)
    print(f"target: {time.monotonic() - started:.1f} s")
    train_eagle(target, ids, rng, out / "eagle")
    print(f"eagle: {time.monotonic() - started:.1f} s")
    # Last, so the target and the head stay what they were before the draft existed.
    train_llama(tok, ids, rng, out / "draft", "draft", DRAFT_LAYERS, DRAFT_STEPS)
    (out / ".built").write_text(f"{time.monotonic() - started:.1f}\n")
    shutil.rmtree(final, ignore_errors=True)
    out.rename(final)
    print(f"built {final} in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
