"""Reference architectures: small, readable models used by tests, demos and zoos.

* :class:`MLP` -- linear layers with a chosen activation.
* :class:`ResidualCNN` -- conv, BatchNorm, ReLU and a residual block.
* :class:`TinyTransformer` -- hand-written multi-head attention and an MLP block,
  pre-LayerNorm, on token ids or on patches.
* :class:`CNN1d` -- two conv1d-BatchNorm-ReLU layers, pooled, for mnist1d signals.
* :class:`DiagonalLinear` -- a diagonal linear network ``x^T (u * v)`` for sparse regression.
"""

from __future__ import annotations

import math

import torch
from torch import nn

ACTIVATIONS = {
    "relu": nn.ReLU,
    "leaky_relu": nn.LeakyReLU,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "sigmoid": nn.Sigmoid,
    "identity": nn.Identity,
}


class MLP(nn.Sequential):
    """Fully connected network ``in -> widths... -> out`` with one activation.

    Example:
        >>> MLP(4, [8, 8], 2)(torch.randn(3, 4)).shape
        torch.Size([3, 2])
    """

    def __init__(self, d_in: int = 40, widths=(64, 64), d_out: int = 10, activation: str = "relu"):
        layers: list[nn.Module] = []
        for w in widths:
            layers += [nn.Linear(d_in, w), ACTIVATIONS[activation]()]
            d_in = w
        layers.append(nn.Linear(d_in, d_out))
        super().__init__(*layers)


class ResidualCNN(nn.Module):
    """Conv-BN-ReLU stem, one residual block, global pooling and a linear head.

    Example:
        >>> ResidualCNN(channels=4)(torch.randn(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """

    def __init__(self, in_channels: int = 1, channels: int = 16, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU()
        )
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for images ``(B, C, H, W)``."""
        h = self.stem(x)
        r = torch.relu(self.bn1(self.conv1(h)))
        h = torch.relu(h + self.bn2(self.conv2(r)))
        return self.head(h.mean(dim=(2, 3)))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(x1, x2) -> (-x2, x1)`` on the two halves of the last axis."""
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    """Multi-head self-attention written out: softmax(q k^T / sqrt(d)) v.

    With ``rotary``, queries and keys get rotary position embeddings
    (``x cos + rotate_half(x) sin``, frequencies ``10000^(-2j/d)``).
    """

    def __init__(self, dim: int, heads: int, rotary: bool = False):
        super().__init__()
        self.heads, self.head_dim, self.rotary = heads, dim // heads, rotary
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        inv_freq = 10000.0 ** (-torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _rotate(self, z: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(z.shape[-2], dtype=self.inv_freq.dtype)
        angles = torch.outer(pos, self.inv_freq).repeat(1, 2).to(z.dtype)
        return z * angles.cos() + rotate_half(z) * angles.sin()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Self-attention over ``x`` of shape ``(B, T, dim)``."""
        b, t, _ = x.shape

        def split(z):
            return z.view(b, t, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        if self.rotary:
            q, k = self._rotate(q), self._rotate(k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        y = scores.softmax(dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    """Transformer block: attention and an MLP (ReLU or GELU), each residual.

    ``norm="pre"`` (ViT, GPT-2): ``x + f(LN(x))``; ``norm="post"`` (BERT):
    ``LN(x + f(x))``. LayerNorms carry affine gains and biases.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        hidden: int,
        rotary: bool = False,
        activation: str = "relu",
        norm: str = "pre",
    ):
        super().__init__()
        if norm not in ("pre", "post"):
            raise ValueError(f"norm must be 'pre' or 'post', got {norm!r}")
        self.post = norm == "post"
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, rotary)
        act = ACTIVATIONS[activation]()
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), act, nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One pre- or post-norm block."""
        if self.post:
            x = self.norm1(x + self.attn(x))
            return self.norm2(x + self.mlp(x))
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    """Token (or patch) embedding, positional embedding, blocks, mean-pooled head.

    Args:
        vocab: vocabulary size for token-id inputs; 0 means inputs are float
            sequences of ``patch`` features (e.g. mnist1d as patches).
        rotary: rotary position embeddings on queries and keys (besides ``pos``).
        activation: the MLP's nonlinearity (``"relu"``, ``"gelu"``, ...).
        norm: ``"pre"`` (pre-LN blocks and a final LayerNorm, as ViT) or ``"post"``
            (post-LN blocks, as BERT).
        pool: ``"mean"`` (logits ``(B, classes)`` of the mean token) or ``"none"``
            (logits ``(B, T, classes)`` per token: masked-token pretraining).

    Example:
        >>> TinyTransformer(vocab=11, dim=8, heads=2, depth=1)(torch.randint(0, 11, (2, 5))).shape
        torch.Size([2, 10])
    """

    def __init__(
        self,
        vocab: int = 0,
        patch: int = 4,
        seq: int = 10,
        dim: int = 32,
        heads: int = 4,
        depth: int = 2,
        hidden: int = 64,
        classes: int = 10,
        rotary: bool = False,
        activation: str = "relu",
        norm: str = "pre",
        pool: str = "mean",
    ):
        super().__init__()
        if pool not in ("mean", "none"):
            raise ValueError(f"pool must be 'mean' or 'none', got {pool!r}")
        self.pool = pool
        self.embed = nn.Embedding(vocab, dim) if vocab else nn.Linear(patch, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = nn.ModuleList(
            Block(dim, heads, hidden, rotary, activation, norm) for _ in range(depth)
        )
        # pre-norm stacks end in a LayerNorm; post-norm blocks already end in one
        self.norm = nn.LayerNorm(dim) if norm == "pre" else nn.Identity()
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for token ids ``(B, T)`` or patches ``(B, T, patch)`` (per token: ``pool``)."""
        h = self.embed(x) + self.pos[: x.shape[1]]
        for block in self.blocks:
            h = block(h)
        h = self.norm(h)
        return self.head(h.mean(dim=1) if self.pool == "mean" else h)


class CNN1d(nn.Module):
    """Two conv1d-BatchNorm-ReLU layers, global average pooling and a linear head.

    Takes mnist1d inputs ``(B, length)`` (reshaped to one channel inside forward).

    Example:
        >>> CNN1d(channels=4)(torch.randn(2, 40)).shape
        torch.Size([2, 10])
    """

    def __init__(self, channels: int = 32, kernel: int = 5, classes: int = 10):
        super().__init__()
        pad = kernel // 2
        self.conv1, self.bn1 = nn.Conv1d(1, channels, kernel, padding=pad), nn.BatchNorm1d(channels)
        self.conv2 = nn.Conv1d(channels, channels, kernel, padding=pad)
        self.bn2 = nn.BatchNorm1d(channels)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for signals ``(B, length)``."""
        h = torch.relu(self.bn1(self.conv1(x.unsqueeze(1))))
        h = torch.relu(self.bn2(self.conv2(h)))
        return self.head(h.mean(dim=2))


class DiagonalLinear(nn.Module):
    """Diagonal linear network ``y = x^T (u * v)``, ``u, v`` initialised ``N(0, 1/d)``.

    Scaling the initialisation moves gradient descent between sparse (small
    scale, L1-like) and dense (large scale, L2-like) solutions.

    Example:
        >>> DiagonalLinear(5)(torch.randn(3, 5)).shape
        torch.Size([3])
    """

    def __init__(self, d: int = 100):
        super().__init__()
        self.u = nn.Parameter(torch.randn(d) * d**-0.5)
        self.v = nn.Parameter(torch.randn(d) * d**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Predictions ``(B,)`` for inputs ``(B, d)``."""
        return x @ (self.u * self.v)
