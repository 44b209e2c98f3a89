"""Small models written the way real model zoos write them, so ``torch.fx.symbolic_trace`` fails.

Each class carries one quirk found in the wild (named in its docstring) and an
``example_inputs()`` method returning ``(args, kwargs)``. They exist to exercise capture
fallbacks: all but :class:`DataDependentMLP` can be captured by ``torch.export`` instead.

    >>> import torch
    >>> model = DictOutputNet()
    >>> args, kwargs = model.example_inputs()
    >>> sorted(model(*args, **kwargs))
    ['aux', 'logits']
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "DataDependentMLP",
    "ShapeBranchNet",
    "InplaceAssignNet",
    "ZooOutput",
    "DataclassOutputNet",
    "DictOutputNet",
    "GPT2ConvConfig",
    "CausalLMOutput",
    "Conv1D",
    "Conv1DGPT2",
]

ExampleInputs = tuple[tuple, dict]


class DataDependentMLP(nn.Module):
    """Two Linears with a branch on a tensor *value* between them.

    Quirk: ``if h.mean() > 0: relu else: tanh``. fx cannot turn a Proxy into a bool, and
    ``torch.export`` cannot guard on a data-dependent value, so neither captures it.

        >>> args, _ = DataDependentMLP().example_inputs(batch=2)
        >>> DataDependentMLP()(*args).shape
        torch.Size([2, 4])
    """

    def __init__(self, in_features: int = 16, hidden: int = 32, out_features: int = 4) -> None:
        super().__init__()
        self.in_features = in_features
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, in_features] -> [B, out_features]``."""
        h = self.fc1(x)
        if h.mean() > 0:  # noqa: SIM108 - the statement form is the quirk
            h = torch.relu(h)
        else:
            h = torch.tanh(h)
        return self.fc2(h)

    def example_inputs(self, batch: int = 4) -> ExampleInputs:
        """``((x,), {})`` with ``x ~ randn(batch, in_features)``."""
        return (torch.randn(batch, self.in_features, device=self.fc1.weight.device),), {}


class ShapeBranchNet(nn.Module):
    """Sequence classifier that truncates or pads its input to a fixed window, branching on shapes.

    Quirks: ``if x.shape[1] > window`` (keep the last ``window`` steps) / ``elif < window``
    (left-pad with zeros), then ``x.view(x.size(0), -1)``. fx cannot branch on a Proxy shape;
    ``torch.export`` specializes on the example's shape and captures it.

        >>> ShapeBranchNet()(torch.randn(2, 5, 4)).shape
        torch.Size([2, 4])
    """

    def __init__(self, features: int = 4, window: int = 16, hidden: int = 32, out_features: int = 4) -> None:
        super().__init__()
        self.features = features
        self.window = window
        self.fc1 = nn.Linear(window * features, hidden)
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, features]`` (any ``T``) to ``[B, out_features]``."""
        if x.shape[1] > self.window:
            x = x[:, -self.window :]
        elif x.shape[1] < self.window:
            x = F.pad(x, (0, 0, self.window - x.shape[1], 0))
        x = x.contiguous().view(x.size(0), -1)
        return self.fc2(torch.relu(self.fc1(x)))

    def example_inputs(self, batch: int = 4, seq_len: int = 24) -> ExampleInputs:
        """``((x,), {})``, ``x ~ randn(batch, seq_len, features)``; the default length truncates."""
        return (torch.randn(batch, seq_len, self.features, device=self.fc1.weight.device),), {}


class InplaceAssignNet(nn.Module):
    """Two Linears with item assignment into the hidden activations.

    Quirk: ``h[..., 0] = 0.0`` and ``h[:, :2] = h[:, :2] * 2`` in forward. fx Proxies do not
    support item assignment; ``torch.export`` records them as in-place index ops.

        >>> InplaceAssignNet()(torch.randn(2, 16)).shape
        torch.Size([2, 4])
    """

    def __init__(self, in_features: int = 16, hidden: int = 32, out_features: int = 4) -> None:
        super().__init__()
        self.in_features = in_features
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, in_features] -> [B, out_features]``."""
        h = self.fc1(x)
        h[..., 0] = 0.0
        h[:, :2] = h[:, :2] * 2
        return self.fc2(torch.relu(h))

    def example_inputs(self, batch: int = 4) -> ExampleInputs:
        """``((x,), {})`` with ``x ~ randn(batch, in_features)``."""
        return (torch.randn(batch, self.in_features, device=self.fc1.weight.device),), {}


@dataclass
class ZooOutput:
    """What :class:`DataclassOutputNet` returns, in the style of Hugging Face ``ModelOutput``."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None
    hidden: tuple[torch.Tensor, ...] | None = None


class DataclassOutputNet(nn.Module):
    """Classifier returning a dataclass, with keyword-only options.

    Quirks: ``forward(x, *, labels=None, return_hidden=False)`` returns :class:`ZooOutput`;
    the loss is computed only ``if labels is not None`` and the hidden states only
    ``if return_hidden``. fx would make ``return_hidden`` a Proxy, and ``bool(Proxy)`` fails;
    sparsefx traces non-tensor arguments as constants and keys its graphs by them, so fx
    captures it (``torch.export`` would too, once ``ZooOutput`` is registered as a pytree).

        >>> out = DataclassOutputNet()(torch.randn(2, 16), labels=torch.tensor([0, 1]))
        >>> out.logits.shape, out.loss.shape, out.hidden
        (torch.Size([2, 4]), torch.Size([]), None)
    """

    def __init__(self, in_features: int = 16, hidden: int = 32, num_classes: int = 4) -> None:
        super().__init__()
        self.in_features = in_features
        self.num_classes = num_classes
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(
        self, x: torch.Tensor, *, labels: torch.Tensor | None = None, return_hidden: bool = False
    ) -> ZooOutput:
        """``[B, in_features]`` to logits ``[B, num_classes]``, plus cross-entropy when given labels."""
        h1 = torch.relu(self.fc1(x))
        h2 = torch.relu(self.fc2(h1))
        logits = self.classifier(h2)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits, labels)
        hidden = None
        if return_hidden:
            hidden = (h1, h2)
        return ZooOutput(logits=logits, loss=loss, hidden=hidden)

    def example_inputs(self, batch: int = 4) -> ExampleInputs:
        """``((x,), {"labels": ..., "return_hidden": True})``."""
        device = self.fc1.weight.device
        x = torch.randn(batch, self.in_features, device=device)
        labels = torch.randint(0, self.num_classes, (batch,), device=device)
        return (x,), {"labels": labels, "return_hidden": True}


class DictOutputNet(nn.Module):
    """Recurrent sequence model returning ``{"logits": [B, num_classes], "aux": [B, T]}``.

    Quirk: a hand-written recurrence, ``for t in range(x.size(1))``, as custom RNN cells in
    zoos do; fx cannot use a Proxy as a ``range`` bound. ``torch.export`` unrolls the loop for
    the example's length and captures the dict output.

        >>> out = DictOutputNet()(torch.randn(2, 5, 16))
        >>> out["logits"].shape, out["aux"].shape
        (torch.Size([2, 4]), torch.Size([2, 5]))
    """

    def __init__(self, features: int = 16, hidden: int = 32, num_classes: int = 4) -> None:
        super().__init__()
        self.features = features
        self.hidden = hidden
        self.cell = nn.Linear(features, hidden)
        self.recur = nn.Linear(hidden, hidden, bias=False)
        self.head = nn.Linear(hidden, num_classes)
        self.aux_head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """``[B, T, features]`` to logits from the last state and one auxiliary score per step."""
        state = x.new_zeros(x.size(0), self.hidden)
        scores = []
        for t in range(x.size(1)):
            state = torch.tanh(self.cell(x[:, t]) + self.recur(state))
            scores.append(self.aux_head(state))
        return {"logits": self.head(state), "aux": torch.cat(scores, dim=1)}

    def example_inputs(self, batch: int = 2, seq_len: int = 8) -> ExampleInputs:
        """``((x,), {})`` with ``x ~ randn(batch, seq_len, features)``."""
        return (torch.randn(batch, seq_len, self.features, device=self.cell.weight.device),), {}


@dataclass(frozen=True)
class GPT2ConvConfig:
    """Shape of a :class:`Conv1DGPT2` (field names follow Hugging Face's ``GPT2Config``)."""

    vocab_size: int = 64
    n_positions: int = 32
    n_embd: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_inner: int = 64
    layer_norm_epsilon: float = 1e-5


@dataclass
class CausalLMOutput:
    """What :class:`Conv1DGPT2` returns: ``logits [B, T, V]`` and the LM loss when labels were given."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None


class Conv1D(nn.Module):
    """Hugging Face's ``Conv1D``: a Linear whose ``weight`` is stored ``[in, out]`` (transposed).

    >>> Conv1D(nf=6, nx=4).weight.shape
    torch.Size([4, 6])
    """

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., nx] -> [..., nf]`` via ``addmm`` on the flattened input."""
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class GPT2Attention(nn.Module):
    """Causal attention with a registered boolean ``bias`` buffer as the causal mask."""

    def __init__(self, config: GPT2ConvConfig) -> None:
        super().__init__()
        n = config.n_positions
        self.register_buffer(
            "bias", torch.tril(torch.ones((n, n), dtype=torch.bool)).view(1, 1, n, n), persistent=False
        )
        self.num_heads = config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.c_attn = Conv1D(3 * config.n_embd, config.n_embd)
        self.c_proj = Conv1D(config.n_embd, config.n_embd)

    def _split_heads(self, t: torch.Tensor) -> torch.Tensor:
        new_shape = t.size()[:-1] + (self.num_heads, self.head_dim)
        return t.view(new_shape).permute(0, 2, 1, 3)

    def _merge_heads(self, t: torch.Tensor) -> torch.Tensor:
        t = t.permute(0, 2, 1, 3).contiguous()
        return t.view(t.size()[:-2] + (self.num_heads * self.head_dim,))

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, T, C] -> [B, T, C]``; ``attention_mask`` is additive, ``[B, 1, 1, T]``."""
        query, key, value = self.c_attn(hidden).split(self.num_heads * self.head_dim, dim=2)
        query, key, value = self._split_heads(query), self._split_heads(key), self._split_heads(value)
        w = torch.matmul(query, key.transpose(-1, -2))
        w = w / torch.full([], value.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
        q_len, k_len = query.size(-2), key.size(-2)
        causal = self.bias[:, :, k_len - q_len : k_len, :k_len]
        mask_value = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)
        w = torch.where(causal, w, mask_value)
        if attention_mask is not None:
            w = w + attention_mask
        w = torch.softmax(w, dim=-1)
        return self.c_proj(self._merge_heads(torch.matmul(w, value)))


class GPT2MLP(nn.Module):
    """``c_fc`` (C -> n_inner), GELU (tanh approximation), ``c_proj`` (n_inner -> C)."""

    def __init__(self, config: GPT2ConvConfig) -> None:
        super().__init__()
        self.c_fc = Conv1D(config.n_inner, config.n_embd)
        self.c_proj = Conv1D(config.n_embd, config.n_inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., C] -> [..., C]``."""
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class GPT2Block(nn.Module):
    """Pre-LayerNorm block: ``ln_1``, ``attn``, ``ln_2``, ``mlp``."""

    def __init__(self, config: GPT2ConvConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = GPT2Attention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = GPT2MLP(config)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, T, C] -> [B, T, C]``."""
        hidden = hidden + self.attn(self.ln_1(hidden), attention_mask)
        return hidden + self.mlp(self.ln_2(hidden))


class GPT2Model(nn.Module):
    """The ``transformer`` trunk: ``wte``, ``wpe``, ``h.{i}``, ``ln_f``."""

    def __init__(self, config: GPT2ConvConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.h = nn.ModuleList(GPT2Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)


class Conv1DGPT2(nn.Module):
    """A tiny GPT-2 look-alike in the Hugging Face style, with an untied ``lm_head``.

    Quirks: ``Conv1D`` layers with ``[in, out]`` weights applied through ``torch.addmm``;
    a causal ``bias`` buffer sliced by runtime lengths; ``if attention_mask is not None``;
    the additive mask built with ``torch.zeros(batch_size, 1, 1, seq_len)`` from runtime sizes
    and filled by item assignment using ``torch.finfo(dtype).min`` (fx fails here: its Proxies
    are neither ints nor dtypes, nor assignable); a dataclass output whose
    ``loss`` is the shifted cross-entropy when ``labels`` are given. Parameters are named like
    Hugging Face's: ``transformer.h.0.attn.c_attn.weight``, ``transformer.wte.weight``, ...

        >>> model = Conv1DGPT2()
        >>> args, kwargs = model.example_inputs(batch=2, seq_len=8)
        >>> out = model(*args, **kwargs)
        >>> out.logits.shape, out.loss.shape
        (torch.Size([2, 8, 64]), torch.Size([]))
    """

    def __init__(self, config: GPT2ConvConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or GPT2ConvConfig()
        self.transformer = GPT2Model(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        nn.init.normal_(self.transformer.wte.weight, std=0.02)
        nn.init.normal_(self.transformer.wpe.weight, std=0.01)
        nn.init.normal_(self.lm_head.weight, std=0.02)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> CausalLMOutput:
        """Token ids ``[B, T]`` (optional 0/1 ``attention_mask [B, T]``, ``labels [B, T]``) to logits."""
        input_shape = input_ids.size()
        input_ids = input_ids.view(-1, input_shape[-1])
        batch_size, seq_len = input_ids.shape[0], input_ids.shape[1]
        dtype = self.transformer.wte.weight.dtype
        position_ids = torch.arange(0, seq_len, dtype=torch.long, device=input_ids.device).unsqueeze(0)
        hidden = self.transformer.wte(input_ids) + self.transformer.wpe(position_ids)

        additive_mask = None
        if attention_mask is not None:
            attention_mask = attention_mask.view(batch_size, -1)
            additive_mask = torch.zeros(batch_size, 1, 1, seq_len, dtype=dtype, device=input_ids.device)
            additive_mask[:, 0, 0, :] = (1.0 - attention_mask.to(dtype)) * torch.finfo(dtype).min

        for block in self.transformer.h:
            hidden = block(hidden, additive_mask)
        hidden = self.transformer.ln_f(hidden)
        output_shape = (-1,) + input_shape[1:] + (hidden.size(-1),)
        logits = self.lm_head(hidden.view(output_shape))

        loss = None
        if labels is not None:
            shift_logits = logits[..., :-1, :].contiguous()
            shift_labels = labels[..., 1:].contiguous()
            loss = F.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))
        return CausalLMOutput(logits=logits, loss=loss)

    def example_inputs(self, batch: int = 2, seq_len: int = 16) -> ExampleInputs:
        """``((input_ids,), {"attention_mask": ..., "labels": input_ids})``.

        The first row's last two steps are masked out as padding.
        """
        device = self.lm_head.weight.device
        input_ids = torch.randint(0, self.config.vocab_size, (batch, seq_len), device=device)
        attention_mask = torch.ones(batch, seq_len, dtype=torch.long, device=device)
        attention_mask[0, -2:] = 0
        return (input_ids,), {"attention_mask": attention_mask, "labels": input_ids}
