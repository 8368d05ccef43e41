"""A GPT-2-style decoder (nanoGPT's layout): token and position embeddings, pre-LayerNorm blocks of
causal multi-head attention and a GELU MLP, dropout, and a head tied to the token embedding.

Differences from nanoGPT, made so that every op had a class in the rounded execution's registry (which
has since gained gelu, embedding_dense_backward and torch's fused norms; the forms below stay, as they
define the computation):
- the token embedding is a one-hot matmul (its backward is a matmul; embedding_dense_backward is a
  scatter-add whose order differs between devices), and sequences always have the full context;
- LayerNorm and GELU (the tanh form of GPT-2) are written out (vtrain.models.norms; under rounded execution their
  elementwise ops run fused to the same values, vtrain.fused_norms and vtrain.fused_gelu);
- masked attention scores are set to -128, not -inf: after the softmax they are exactly 0 on the
  grid (exp underflows), and the softmax's error bound stays finite;
- dropout masks come from the caller (drawn from the seed), in the order of `dropout_shapes`.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode

from vtrain.models.norms import LayerNorm

MASKED_SCORE = -128.0


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): these ops, or under rounded execution the
    same values by vtrain.fused_gelu's three passes where it takes x (for an x that feeds the GELU alone, as here)."""
    if _get_current_dispatch_mode() is not None:  # (a rounded execution, maybe: fused_gelu.gelu tells)
        from vtrain import fused_gelu  # noqa: PLC0415 (numba's import: only processes that round pay it)
        fast = fused_gelu.gelu(x)
        if fast is not None:
            return fast
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))


class _Dropped:
    """Hands out the step's dropout masks in order (an iterator with a no-mask mode)."""

    def __init__(self, masks: Sequence[torch.Tensor]) -> None:
        self._masks = iter(masks) if masks else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x if self._masks is None else x * next(self._masks)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, context: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)
        self.register_buffer("future", torch.ones(context, context, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, x: torch.Tensor, drop: _Dropped) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)   # (B, H, T, hd)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)   # (B, H, T, hd)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)   # (B, H, T, hd)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))   # (B, H, T, T)
        att = drop(F.softmax(att.masked_fill(self.future, MASKED_SCORE), dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)        # (B, H, T, hd) -> (B, T, C)
        return drop(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.c_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor, drop: _Dropped) -> torch.Tensor:
        return drop(self.c_proj(gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, context: int) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads, context)
        self.ln_2 = LayerNorm(d_model)
        self.mlp = MLP(d_model)

    def forward(self, x: torch.Tensor, drop: _Dropped) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), drop)
        return x + self.mlp(self.ln_2(x), drop)


class GPT2(nn.Module):
    def __init__(self, vocab: int, context: int, d_model: int, layers: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.vocab, self.context, self.d_model, self.heads = vocab, context, d_model, heads
        self.wte = nn.Parameter(torch.empty(vocab, d_model))
        self.wpe = nn.Parameter(torch.empty(context, d_model))
        self.h = nn.ModuleList(Block(d_model, heads, context) for _ in range(layers))
        self.ln_f = LayerNorm(d_model)
        self.dropout = dropout

    def dropout_shapes(self) -> list[tuple[int, ...]]:
        """Per-example shapes of the dropout masks, in the order forward uses them."""
        t, c = self.context, self.d_model
        per_block = [(self.heads, t, t), (t, c), (t, c)]   # attention weights, attention out, MLP out
        return [(t, c)] + per_block * len(self.h)

    def forward(self, idx: torch.Tensor, masks: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        drop = _Dropped(masks)
        one_hot = (idx.unsqueeze(-1) == torch.arange(self.vocab, device=idx.device)).to(self.wte.dtype)  # (B, T, V)
        x = drop(one_hot @ self.wte + self.wpe)          # (B, T, C)
        for block in self.h:
            x = block(x, drop)
        return self.ln_f(x) @ self.wte.t()               # (B, T, V) logits, head tied to wte
