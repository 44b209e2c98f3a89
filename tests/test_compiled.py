"""The compiled task queues (``runtime/compiled.py``) give the tensor form's finishes, tie rules included."""

from __future__ import annotations

import pytest
import torch

from sparsefx.runtime import compiled
from sparsefx.runtime import queues as q

pytest.importorskip("numba")


def _tensor_form(monkeypatch: pytest.MonkeyPatch, fn, *args):
    with monkeypatch.context() as m:
        m.setenv("SPARSEFX_NUMBA", "0")
        assert not compiled.available(*[a for a in args if isinstance(a, torch.Tensor)])
        return fn(*args)


@pytest.mark.parametrize("seed", range(40))
def test_fifo_matches_the_tensor_form(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 3000, (1,), generator=g))
    pes = int(torch.randint(1, 50, (1,), generator=g))
    spread = [1, 5, 100, 10**6][seed % 4]  # many ties ... all distinct
    pe = torch.randint(0, pes, (n,), generator=g) + [0, 7, 1000][seed % 3]
    arrival = torch.randint(-spread, spread, (n,), generator=g)
    if seed % 5 == 0:  # arrivals in order on each PE, as lanes mostly see them
        arrival = torch.sort(arrival).values
    cost = torch.randint(0, 9, (n,), generator=g) * (torch.rand(n, generator=g) > 0.2)
    assert compiled.available(pe, arrival, cost)
    assert torch.equal(q.fifo(pe, arrival, cost), _tensor_form(monkeypatch, q.fifo, pe, arrival, cost))


@pytest.mark.parametrize("seed", range(40))
def test_finishes_match_the_tensor_form(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(seed)
    blocks = int(torch.randint(1, 12, (1,), generator=g))
    pairs = int(torch.randint(1, 4000, (1,), generator=g))
    pes = int(torch.randint(1, 300, (1,), generator=g))
    pe = torch.sort(torch.randint(0, pes, (pairs,), generator=g)).values  # pairs PE by PE
    spread = [3, 50, 10**5][seed % 3]
    arr = torch.randint(0, spread, (blocks, pairs), generator=g)
    if seed % 2:  # later blocks arrive later, as they do on the mesh
        arr += torch.arange(blocks)[:, None] * spread
    cost = torch.randint(1, 20, (blocks, pairs), generator=g) * (torch.rand(blocks, pairs, generator=g) > 0.3)
    t0 = [0, spread // 2][seed % 2]
    assert compiled.finishes(pe, arr, cost, pes, t0, q.NEVER) is not None
    finish, busy, first = q.finishes(pe, arr, cost, pes, t0)
    want_finish, want_busy, want_first = _tensor_form(monkeypatch, q.finishes, pe, arr, cost, pes, t0)
    assert torch.equal(finish, want_finish) and torch.equal(busy, want_busy) and first == want_first


@pytest.mark.parametrize("seed", range(30))
def test_sparse_tasks_match_the_tensor_form(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(seed)
    blocks = int(torch.randint(1, 10, (1,), generator=g))
    pairs = int(torch.randint(1, 3000, (1,), generator=g))
    pes, columns = (int(torch.randint(1, n, (1,), generator=g)) for n in (200, 400))
    pe = torch.sort(torch.randint(0, pes, (pairs,), generator=g)).values
    col = torch.randint(0, columns, (pairs,), generator=g)
    arr = torch.randint(0, [5, 10**4][seed % 2], (blocks, pairs), generator=g)
    arr += torch.arange(blocks)[:, None] * 7  # later blocks mostly later
    count = torch.randint(0, 4, (pairs,), generator=g)  # 0: a pair with no nonzero has no task
    sizes = int(torch.randint(1, 3, (1,), generator=g))
    each = (5 + count * torch.randint(1, 9, (sizes, 1), generator=g)) * (count > 0)
    size_of = torch.randint(0, sizes, (blocks,), generator=g)
    sent = None if seed % 3 == 0 else torch.rand(blocks, columns, generator=g) > [0.1, 0.6, 0.97][seed % 3]
    t0 = [0, 3][seed % 2]
    args = (pe, arr, each, size_of, col, sent, pes, t0)
    got, want = q.sparse_tasks(*args), _tensor_form(monkeypatch, q.sparse_tasks, *args)
    for a, b in zip(got, want):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_keys_that_do_not_fit_take_the_tensor_form() -> None:
    pe = torch.zeros(4, dtype=torch.int64)
    arrival = torch.tensor([0, 1 << 61, 5, 3])
    assert compiled.fifo(pe, arrival, torch.ones(4, dtype=torch.int64)) is None
    assert q.fifo(pe, arrival, torch.ones(4, dtype=torch.int64)).tolist() == [1, (1 << 61) + 1, 6, 4]


@pytest.mark.parametrize("seed", range(20))
def test_arrivals_match_the_tensor_form(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from sparsefx.runtime.arrivals import arrivals_at

    g = torch.Generator().manual_seed(seed)
    blocks, features, lanes = (int(torch.randint(1, n, (1,), generator=g)) for n in (6, 300, 9))
    depart = torch.randint(0, 10**5, (blocks, features), generator=g)
    sends = torch.randint(0, 9, (blocks, features), generator=g)
    live = None if seed % 3 == 0 else torch.rand(blocks, features, generator=g) > 0.4
    ends = torch.sort(torch.randint(1, features + 1, (lanes,), generator=g)).values
    last = torch.searchsorted(ends, torch.arange(features), right=True).clamp(max=lanes - 1)
    last = torch.maximum(ends[last] - 1, torch.arange(features))  # each feature's lane's last feature
    q = torch.randint(0, blocks, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g)
    pairs = int(torch.randint(1, 2000, (1,), generator=g))
    feats = torch.randint(0, features, (pairs,), generator=g)
    hops, climb = torch.randint(0, 60, (pairs,), generator=g), torch.randint(0, 60, (pairs,), generator=g)
    forked = None
    if seed % 2:  # some messages forked onto a column's links and left them when queued there
        keys = int(torch.randint(1, 50, (1,), generator=g))
        start = torch.randint(0, 10**5, (blocks, keys), generator=g)
        k_of = torch.randint(0, keys, (pairs,), generator=g)
        k_of = torch.where(torch.rand(pairs, generator=g) > 0.5, k_of, -1)
        forked = (start, torch.randint(0, blocks, (len(q),), generator=g), k_of)
    args = (depart, sends, live, q, feats, hops, climb, last, forked)
    assert torch.equal(arrivals_at(*args), _tensor_form(monkeypatch, arrivals_at, *args))


CLOCKED = [
    ("mlp", "8x8", "streaming", "block"),
    ("mlp", "16x16", "pipelined", "balanced"),
    ("gpt-tiny", "64x64", "pipelined", "block"),
    ("gpt-tiny", "16x16", "streaming", "balanced"),
    ("cnn", "16x16", "streaming", "balanced"),
]


@pytest.mark.parametrize(("name", "mesh", "mode", "placement"), CLOCKED)
def test_the_clock_times_alike_with_and_without_the_loops(
    name: str, mesh: str, mode: str, placement: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sparsefx
    from sparsefx.models import build_model
    from sparsefx.runtime import reuse

    spec = build_model(name)
    sm = sparsefx.compile(spec.model, {"sparsity": 0.9}, spec.args)
    program = sparsefx.lower(sm, spec.args, mesh=mesh, mode=mode, placement=placement)
    g = torch.Generator().manual_seed(1)
    args = tuple(
        torch.relu(torch.randn(a.shape, generator=g))  # ReLU zeros: filtered messages
        if a.is_floating_point()
        else torch.randint(0, int(a.max()) + 1, a.shape, generator=g)
        for a in spec.args
    )
    monkeypatch.setattr(reuse, "REUSE", False)  # each run times every kernel: none takes the other's timing
    stats = sparsefx.run(program, args).stats.to_json()
    monkeypatch.setenv("SPARSEFX_NUMBA", "0")
    assert sparsefx.run(program, args).stats.to_json() == stats


@pytest.mark.parametrize("seed", range(30))
def test_interval_maxima_match_the_tensor_form(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from sparsefx.runtime import intervals

    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 700, (1,), generator=g))
    blocks = int(torch.randint(1, 6, (1,), generator=g))
    ranges = int(torch.randint(1, 400, (1,), generator=g))
    lo = torch.randint(0, n, (ranges,), generator=g)
    longest = [4, 60, n][seed % 3]
    hi = torch.clamp(lo + torch.randint(0, longest, (ranges,), generator=g), max=n - 1)
    values = torch.randint(-(10**6), 10**6, (n, blocks), generator=g)
    ranged = (values, lo, hi)
    want = _tensor_form(monkeypatch, intervals.range_max_1d, *ranged)
    assert torch.equal(intervals.range_max_1d(*ranged), want)
    value = torch.randint(-50, 50, (ranges, blocks) if seed % 2 else (ranges,), generator=g)
    for how, empty in (("amax", -(1 << 62)), ("amin", 7)):
        stabbed = (lo, hi + 1, value, n, empty, how)
        assert torch.equal(intervals.stab(*stabbed), _tensor_form(monkeypatch, intervals.stab, *stabbed))


@pytest.fixture(scope="module")
def sparse_layouts() -> list:
    """Each sparse matmul's layout and region of gpt-tiny lowered onto 8x8 with either placement."""
    import sparsefx
    from sparsefx.models import build_model
    from sparsefx.runtime.layout import layout

    spec = build_model("gpt-tiny")
    sm = sparsefx.compile(spec.model, {"sparsity": 0.9}, spec.args)
    found = []
    for placement in ("balanced", "block"):
        program = sparsefx.lower(sm, spec.args, mesh="8x8", mode="streaming", placement=placement)
        found += [(layout(program, k), k.region) for k in program.kernels if k.op == "sparse_matmul"]
    return found


@pytest.mark.parametrize("seed", range(6))
def test_partial_sum_maxima_match_the_tensor_form(
    seed: int, sparse_layouts: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparsefx.runtime.intervals import Columns, Holders

    g = torch.Generator().manual_seed(seed)
    for s, region in sparse_layouts:
        w, h = region.width, region.height
        active = torch.nonzero(torch.rand(w * h, generator=g) > [0.0, 0.3, 0.9][seed % 3]).squeeze(1)
        blocks = int(torch.randint(1, 9, (1,), generator=g))
        finish = torch.randint(0, 5000, (len(active), blocks), generator=g)
        t0 = int(torch.randint(0, 100, (1,), generator=g))
        holders = Holders(s, w, h)
        lane = torch.randint(0, h, (len(holders.keys),), generator=g)
        reach = (finish, active, t0, lane, 2, w)
        want = _tensor_form(monkeypatch, holders.reach, *reach)
        assert torch.equal(holders.reach(*reach), want)
        columns = Columns(active, w, h)
        x = torch.randint(0, w, (50,), generator=g)
        lo = torch.randint(0, h, (50,), generator=g)
        hi = torch.clamp(lo + torch.randint(0, h, (50,), generator=g), max=h - 1)
        slowest = (finish, x, lo, hi, t0)
        assert torch.equal(columns.slowest(*slowest), _tensor_form(monkeypatch, columns.slowest, *slowest))


@pytest.mark.parametrize("seed", range(30))
def test_host_queue_matches_the_tensor_form(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs' last messages into the host: arrivals bunched (many messages a bin) or spread, wavelets
    including 0 (filtered), host rates that bind and that do not."""
    from sparsefx.runtime import host

    g = torch.Generator().manual_seed(seed)
    names = [f"out{i}" for i in range(int(torch.randint(1, 5, (1,), generator=g)))]
    spread = [3, 40, 2000][seed % 3]
    rate = [0.7, 2.0, 44.0, 5.5][seed % 4]
    messages = {}
    for n in names:
        size = int(torch.randint(0, 3000, (1,), generator=g))
        heads = torch.randint(0, spread, (size,), generator=g) + [0, 17][seed % 2]
        sends = torch.randint(0, 40, (size,), generator=g) * (torch.rand(size, generator=g) > 0.2)
        messages[n] = (heads, sends)
    assert compiled.available(*[t for pair in messages.values() for t in pair])
    got = host.outputs_in_host(messages, rate)
    assert got == _tensor_form(monkeypatch, host.outputs_in_host, messages, rate)
    whole = {  # message by message, no bins: the rule itself
        n: int(
            host.in_host(
                torch.cat([h for h, _ in messages.values()]),
                torch.cat([s for _, s in messages.values()]),
                rate,
            )[i].max()
        )
        if len(i)
        else 0
        for n, i in _indices(messages).items()
    }
    assert got == whole


def _indices(messages: dict) -> dict:
    out, at = {}, 0
    for n, (h, _) in messages.items():
        out[n] = torch.arange(at, at + len(h))
        at += len(h)
    return out


@pytest.mark.parametrize("seed", range(20))
def test_lane_departures_match_the_tensor_form(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from sparsefx.runtime.timeline import Flow

    g = torch.Generator().manual_seed(seed)
    blocks, features, lanes = (int(torch.randint(1, n, (1,), generator=g)) for n in (9, 400, 70))
    spread = [2, 100, 10**5][seed % 3]  # many ties ... few
    ready = torch.randint(0, spread, (blocks, features), generator=g) + torch.arange(blocks)[:, None] * spread
    live = None if seed % 2 else torch.rand(blocks, features, generator=g) > 0.5  # filtered: 0 or 1 wavelet
    wave = torch.randint(1, 9, (blocks,), generator=g)

    def flow() -> Flow:
        return Flow("v", "float32", features, lanes, blocks * 4, 4, wave, 3, ready, live)

    got, waiting, sends = flow()._queued(ready), flow().waiting(), flow().sends
    monkeypatch.setenv("SPARSEFX_NUMBA", "0")
    assert torch.equal(sends, flow().sends)  # zeros filtered, each lane's end-of-block mark kept
    assert torch.equal(got, flow()._queued(ready))
    want = flow().waiting()  # every message waiting at the start: each lane in order
    assert torch.equal(waiting[0], want[0]) and waiting[1] == want[1]


@pytest.mark.parametrize("seed", range(20))
def test_busiest_links_match_the_tensor_form(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from sparsefx.runtime.intervals import busiest_link

    g = torch.Generator().manual_seed(seed)
    height, messages = (int(torch.randint(1, n, (1,), generator=g)) for n in (120, 3000))
    bus = torch.randint(0, [3, 40, 400][seed % 3], (messages,), generator=g) * 2
    bus += torch.randint(0, 2, (messages,), generator=g)  # + 1: going south
    lane = torch.randint(0, height, (messages,), generator=g)
    south = bus % 2 == 1
    room = torch.where(south, height - lane, lane + 1)  # a message stays on the mesh's rows
    far = 1 + (torch.rand(messages, generator=g) * room).long().clamp(max=room - 1)
    args = (bus, lane, far, height)
    assert torch.equal(busiest_link(*args), _tensor_form(monkeypatch, busiest_link, *args))


@pytest.mark.parametrize("placement", ["balanced", "block"])
def test_merged_matrix_indices_match_the_tensor_form(placement: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import sparsefx
    from sparsefx.errors import EmulationError
    from sparsefx.models import build_model
    from sparsefx.runtime import sparse_eval
    from sparsefx.runtime.encoding import sparse_arrays

    spec = build_model("mlp")
    sm = sparsefx.compile(spec.model, {"sparsity": 0.8}, spec.args)
    program = sparsefx.lower(sm, spec.args, mesh="8x8", mode="streaming", placement=placement)
    for k in (k for k in program.kernels if k.op == "sparse_matmul"):
        arrays = sparse_arrays(program, k)
        s = sparse_eval.read_slices(arrays, k.attrs["in_features"], k.attrs["out_features"], 8, 8, k.name)
        got = sparse_eval._indices(s)
        want = _tensor_form(monkeypatch, sparse_eval._indices, s)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        bad = s.row_idx.clone()
        pe = int(torch.searchsorted(s.nz_ptr, len(bad) // 2, right=True)) - 1  # the PE of the middle nonzero
        bad[len(bad) // 2] = int(s.span[pe])  # one past its output range
        broken = sparse_eval.Slices(**{**vars(s), "row_idx": bad})
        with pytest.raises(EmulationError, match="leaves its PE's output range"):
            sparse_eval._indices(broken)
        with pytest.raises(EmulationError, match="leaves its PE's output range"):
            _tensor_form(monkeypatch, sparse_eval._indices, broken)
