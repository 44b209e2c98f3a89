"""The host's side of the mesh edge: the program's outputs leave the mesh east of its last column and
enter the host through its I/O, ``HardwareSpec.host_wavelets_per_cycle`` wavelets a cycle for all
rows together (``host_bytes_per_s``: 150 GB/s, about 44 wavelets a cycle at 850 MHz).

Both executors charge outputs by this one rule (inputs, the other way, are sent with their messages
stretched by ``lanes / host_wavelets_per_cycle`` where the lanes outnumber what the host can feed).
Each output message reaches the edge on its lane at most one wavelet a cycle; the host takes them in
the order their heads arrive (the order given, on ties), as one queue that drains
``host_wavelets_per_cycle`` wavelets a cycle. A message is in the host when its last wavelet has
arrived and the queue has drained it::

    >>> import torch
    >>> heads = torch.tensor([0, 0, 0, 0])  # four 100-wavelet messages reach the edge at once
    >>> in_host(heads, torch.tensor([100, 100, 100, 100]), rate=2.0).tolist()
    [100, 100, 150, 200]
    >>> in_host(heads, torch.tensor([100, 100, 100, 100]), rate=44.0).tolist()  # the links bind
    [100, 100, 100, 100]

A filtered message (zeros filtered at the sender, 0 wavelets) takes no host time.
"""

from __future__ import annotations

import torch

from . import compiled
from .queues import fifo

__all__ = ["edge_queued", "in_host", "outputs_in_host"]


def edge_queued(
    heads: list[torch.Tensor], sends: list[torch.Tensor], rows: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Each output's messages' heads at the mesh's east edge once every output's messages on the same
    mesh row (``rows``) have taken turns on that row's link off the mesh, one wavelet a cycle, in the
    order their heads come (ties: output, block, feature). ``heads[i]`` is when output ``i``'s heads
    would come with the row to themselves; a lone output's lanes already send one message after
    another, so its heads stay. Two outputs of a pipelined program, made side by side, meet here::

        >>> h = [torch.tensor([[0, 4]]), torch.tensor([[2]])]  # row 0: two messages of 4, then one of 3
        >>> [t.tolist() for t in edge_queued(h, [torch.tensor([[4, 4]]), torch.tensor([[3]])],
        ...                                  [torch.tensor([[0, 0]]), torch.tensor([[0]])])]
        [[[0, 7]], [[4]]]
    """
    if len(heads) < 2:
        return heads
    flat = [torch.cat([t.reshape(-1).to(torch.int64) for t in ts]) for ts in (heads, sends, rows)]
    start = fifo(flat[2], flat[0], flat[1]) - flat[1]
    return [part.view(h.shape) for part, h in zip(start.split([h.numel() for h in heads]), heads)]


def in_host(heads: torch.Tensor, sends: torch.Tensor, rate: float) -> torch.Tensor:
    """``[n]``: when each of ``n`` messages, whose heads reach the edge at ``heads`` carrying ``sends``
    wavelets, is wholly in the host (module docstring). ``rate`` is the host's wavelets per cycle."""
    if heads.numel() == 0:
        return heads.clone()
    heads, sends = heads.to(torch.int64), sends.to(torch.int64)
    order = torch.sort(heads, stable=True).indices
    a, w = heads[order].to(torch.float64), sends[order].to(torch.float64)
    drained = torch.cumsum(w, 0) / rate  # host time of the messages up to and including each
    done = _drained(a, drained, drained - w / rate, heads[order] + sends[order])
    out = torch.empty_like(done)
    out[order] = done
    return out


def _drained(
    a: torch.Tensor, drained: torch.Tensor, before: torch.Tensor, floor: torch.Tensor
) -> torch.Tensor:
    """The host's one FIFO, draining at its rate, over entries in queue order: entry ``i`` (arriving at
    ``a[i]``, with ``drained[i]`` host cycles of wavelets up to its end and ``before[i]`` up to its
    start) is out at ``max over k <= i of (a_k + drained_i - before_k)``, rounded up, and no earlier
    than ``floor[i]`` (its last wavelet off its link)."""
    queue = drained + torch.cummax(a - before, 0).values
    return torch.maximum(torch.ceil(queue - 1e-9).to(torch.int64), floor)


def outputs_in_host(messages: dict[str, tuple[torch.Tensor, torch.Tensor]], rate: float) -> dict[str, int]:
    """When each output is wholly in the host: ``messages`` maps an output to its messages' head
    arrivals at the edge and wavelets; every output shares the host's one queue. An output with no
    messages is in at 0."""
    names = [n for n, (h, _) in messages.items() if h.numel()]
    done = {n: 0 for n in messages}
    if not names:
        return done
    heads, sends = (_joined([messages[n][i] for n in names]) for i in (0, 1))
    dev = heads.device  # the host's tensors, made where the messages are (a clock may run elsewhere)
    sizes = [messages[n][0].numel() for n in names]
    lo, hi = (int(v) for v in torch.aminmax(heads))
    binned = (hi - lo + 1) * len(names) <= max(4 * len(heads), 1 << 22)  # else too spread out for bins
    if binned and compiled.available(heads, sends):
        last = compiled.last_in(heads, sends, sizes, lo, rate)
    else:
        which = torch.repeat_interleave(torch.tensor(sizes, device=dev))
        if binned:
            last = _last_in(heads - lo, sends, which, len(names), lo, rate)
        else:  # message by message
            last = torch.zeros(len(names), dtype=torch.int64, device=dev).scatter_reduce_(
                0, which, in_host(heads, sends, rate), "amax"
            )
    for n, t in zip(names, last.tolist()):
        done[n] = t
    return done


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """The parts flattened end to end as int64 (a lone int64 part as it is: no copy)."""
    flat = [p.reshape(-1).to(torch.int64) for p in parts]
    return flat[0] if len(flat) == 1 else torch.cat(flat)


def _last_in(
    at: torch.Tensor, sends: torch.Tensor, which: torch.Tensor, outputs: int, lo: int, rate: float
) -> torch.Tensor:
    """``[outputs]``: when each output's last message is in the host, as ``in_host`` times every
    message, from one bin per (arrival ``at``, output) instead of a sort of the messages. In arrival
    order, ties in output order, the messages of a bin are consecutive: the queue is longest at the
    bin's last message, and its first message's ``arrival - before`` is the bin's largest."""
    n, dev = len(at), at.device
    key = at * outputs + which
    bins = int(key.max()) + 1
    count = torch.bincount(key, minlength=bins)
    used = count.nonzero().squeeze(1)  # the bins in queue order
    wave = torch.zeros(bins, dtype=torch.int64, device=dev).index_add_(0, key, sends)[used]
    top = torch.zeros(bins, dtype=torch.int64, device=dev).scatter_reduce_(0, key, sends, "amax")[used]
    first = torch.full((bins,), n, dtype=torch.int64, device=dev)
    first = first.scatter_reduce_(0, key, torch.arange(n, device=dev), "amin")[used]
    head = used // outputs + lo
    upto = torch.cumsum(wave, 0).to(torch.float64)  # wavelets up to each bin's last message
    w0 = sends[first].to(torch.float64)
    before = (upto - wave + w0) / rate - w0 / rate  # as ``in_host`` has it at the bin's first message
    done = _drained(head.to(torch.float64), upto / rate, before, head + top)
    last = torch.zeros(outputs, dtype=torch.int64, device=dev)
    return last.scatter_reduce_(0, used % outputs, done, "amax")

