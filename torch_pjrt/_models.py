"""Small reference models shared by the example, the training-parity tests and the benchmarks.

They are ordinary PyTorch modules: nothing here knows about the tpu device.
"""
import ast
import codecs
import importlib.util
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def zen_corpus() -> str:
    """The Zen of Python, decoded from the stdlib's rot13 copy (read, not imported: importing
    `this` prints it)."""
    src = open(importlib.util.find_spec("this").origin, encoding="utf-8").read()
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "s":
            return codecs.decode(ast.literal_eval(node.value), "rot13")
    raise RuntimeError("the stdlib module `this` has no text")


class CharDataset:
    """Character-level next-token data over a text: deterministic batches from a generator."""

    def __init__(self, text: str, block: int):
        chars = sorted(set(text))
        self.vocab = len(chars)
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.data = torch.tensor([self.stoi[c] for c in text], dtype=torch.long)
        self.block = block

    def batch(self, batch_size: int, gen: torch.Generator):
        ix = torch.randint(len(self.data) - self.block - 1, (batch_size,), generator=gen)
        x = torch.stack([self.data[i : i + self.block] for i in ix.tolist()])
        y = torch.stack([self.data[i + 1 : i + 1 + self.block] for i in ix.tolist()])
        return x, y


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """tie_head: the output head shares the token embedding's weight, as in GPT-2."""

    def __init__(self, vocab: int, block: int = 32, d: int = 64, heads: int = 4, layers: int = 2,
                 tie_head: bool = False):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        if tie_head:
            self.head.weight = self.tok.weight

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.blocks(self.tok(idx) + self.pos(pos))
        logits = self.head(self.ln(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


class MLP(nn.Module):
    def __init__(self, d_in: int = 32, hidden: int = 64, classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.Tanh(), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


class GeluMLPBlock(nn.Module):
    """Elementwise-heavy stack: pre-norm GELU MLPs with residual connections (the benchmark's
    fusion case: most ops are cheap elementwise ops between few matmuls)."""

    def __init__(self, d: int = 128, hidden: int = 256, layers: int = 4):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.up = nn.ModuleList(nn.Linear(d, hidden) for _ in range(layers))
        self.down = nn.ModuleList(nn.Linear(hidden, d) for _ in range(layers))
        self.head = nn.Linear(d, 1)

    def forward(self, x):
        for norm, up, down in zip(self.norms, self.up, self.down):
            x = x + down(nn.functional.gelu(up(norm(x)))) * 0.5
        return self.head(x).squeeze(-1)


def init_weights(model: nn.Module, seed: int) -> nn.Module:
    """Deterministic initial weights (so CPU and tpu copies start identical)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return model


def word_list(vocab_size: int) -> list[str]:
    """The words of save_word_tokenizer's vocabulary, by token id."""
    return ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(vocab_size - 4)]


def save_word_tokenizer(path, vocab_size: int, chat_template: str | None = None):
    """A word-level tokenizer for random test models, saved to `path` (a model directory for
    Hugging Face and vLLM) and returned: the specials ``<pad>`` (0), ``<s>`` (1), ``</s>`` (2)
    and ``<unk>`` (3), then token 4 + i is the word ``w{i}`` (``word_list`` gives them all);
    words split and join at spaces. Built locally: nothing is downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(word_list(vocab_size))},
                                     unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # words joined by spaces
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                     unk_token="<unk>", pad_token="<pad>")
    if chat_template is not None:
        hf_tok.chat_template = chat_template
    hf_tok.save_pretrained(path)
    return hf_tok
