"""The sparse matmul as the PEs compute it, from a ``sparse_matmul`` kernel's per-PE CSC slices.

Each PE multiplies the input features of its range ``[in_lo, in_hi)`` by its own nonzeros (one AXPY per
arriving feature, over that feature's column of its CSC slice) into its local output rows; the partial
sums of each output are then added across PEs (the reduction routes), and the bias last (for
``addmm``: ``beta * bias + alpha * product``). ``runtime/csc.py`` describes the arrays. The work is
vectorized over PEs and nonzeros: the slices are merged once into one sparse row per output, its
nonzeros PE by PE (each PE's AXPY terms in its own order, then the PEs' partial sums in turn: the same
sum, reassociated), read in groups of PEs so that memory stays bounded; no dense weight is ever built.
Convolutions are im2col (``F.unfold``), inputs ordered ``(channel, kh, kw)`` as ``weight.reshape(out,
-1)`` is, then the same product, folded back. One PE holding ``W[0, 1] = 5`` and ``W[1, 2] = 7``::

    >>> arrays = {"out_lo": torch.tensor([0], dtype=torch.int32),
    ...           "out_hi": torch.tensor([2], dtype=torch.int32),
    ...           "nz_ptr": torch.tensor([0, 2]), "col_ptr_off": torch.tensor([0, 4]),
    ...           "col_ptr": torch.tensor([0, 0, 1, 2], dtype=torch.int32),
    ...           "row_idx": torch.tensor([0, 1], dtype=torch.int16),
    ...           "values": torch.tensor([5.0, 7.0])}
    >>> s = read_slices(arrays, in_features=3, out_features=2, width=1, height=1, where="kernel 'k'")
    >>> product(s, torch.tensor([[1.0, 2.0, 3.0]])).tolist()
    [[10.0, 21.0]]
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from sparsefx.errors import EmulationError

from . import compiled
from .cost import EPILOGUES
from .elementwise import call
from .memo import kept
from .program import lane_bounds

__all__ = ["CHUNK_ELEMENTS", "Product", "Slices", "read_slices", "product", "sparse_matmul"]

CHUNK_ELEMENTS = 1 << 22
"""Elements of one scratch buffer (nonzeros and column entries of PEs, rows x inputs of im2col)."""

_ROWS_PER_CHUNK = 256


@dataclass(frozen=True)
class Slices:
    """A kernel's CSC slices, checked, with int64 offsets; ``read_slices`` makes one."""

    in_features: int
    out_features: int
    nz_ptr: torch.Tensor
    col_ptr_off: torch.Tensor
    col_ptr: torch.Tensor
    row_idx: torch.Tensor
    values: torch.Tensor
    out_lo: torch.Tensor
    span: torch.Tensor
    in_lo: torch.Tensor
    in_hi: torch.Tensor
    where: str
    sources: tuple[torch.Tensor, ...] = ()  # the arrays as given, which derived results are keyed by

    @property
    def pes(self) -> int:
        """How many PEs hold slices."""
        return len(self.out_lo)


def _need(arrays: Mapping[str, torch.Tensor], role: str, where: str) -> torch.Tensor:
    if role not in arrays:
        raise EmulationError(f"{where}: has no {role!r} array; a sparse_matmul needs it")
    return arrays[role]


def read_slices(
    arrays: Mapping[str, torch.Tensor],
    in_features: int,
    out_features: int,
    width: int,
    height: int,
    where: str,
) -> Slices:
    """The slices of a ``width`` x ``height`` region, their sizes and offsets checked.

    ``where`` names the kernel in errors: an ``EmulationError`` for any array of the wrong size or
    offsets that do not fit (the module docstring has an example).
    """
    pes = width * height

    def fail(why: str) -> EmulationError:
        return EmulationError(f"{where}: {why}")

    get = {r: _need(arrays, r, where) for r in ("out_lo", "out_hi", "nz_ptr", "col_ptr_off", "col_ptr")}
    row_idx, values = _need(arrays, "row_idx", where), _need(arrays, "values", where)
    nz_ptr, col_off = get["nz_ptr"].to(torch.int64), get["col_ptr_off"].to(torch.int64)
    out_lo, out_hi = get["out_lo"].to(torch.int64), get["out_hi"].to(torch.int64)
    for role, t, n in (("nz_ptr", nz_ptr, pes + 1), ("col_ptr_off", col_off, pes + 1)):
        if len(t) != n:
            raise fail(f"array {role!r} has {len(t)} entries; a {width}x{height} region needs {n}")
    for role, t in (("out_lo", out_lo), ("out_hi", out_hi)):
        if len(t) != pes:
            raise fail(f"array {role!r} has {len(t)} entries; a {width}x{height} region needs {pes}")
    if "in_lo" in arrays or "in_hi" in arrays:
        in_lo, in_hi = (_need(arrays, r, where).to(torch.int64) for r in ("in_lo", "in_hi"))
        if len(in_lo) != pes or len(in_hi) != pes:
            raise fail(f"arrays 'in_lo'/'in_hi' have {len(in_lo)}/{len(in_hi)} entries; {pes} needed")
    else:
        bounds = lane_bounds(in_features, height).to(nz_ptr.device)
        in_lo, in_hi = bounds[:-1].repeat_interleave(width), bounds[1:].repeat_interleave(width)
    span = out_hi - out_lo
    if pes and bool(((in_lo < 0) | (in_hi < in_lo) | (in_hi > in_features)).any()):
        raise fail(f"a PE's input range leaves [0, {in_features}]")
    if pes and bool(((out_lo < 0) | (out_lo >= max(out_features, 1)) | (span < 0)).any()):
        raise fail(f"a PE's output range does not start in [0, {out_features}) or is negative")
    nnz = len(values)
    if (
        int(nz_ptr[0]) != 0
        or int(nz_ptr[-1]) != nnz
        or len(row_idx) != nnz
        or bool((nz_ptr.diff() < 0).any())
    ):
        raise fail(
            f"array 'nz_ptr' runs from {int(nz_ptr[0])} to {int(nz_ptr[-1])}; 'values' has {nnz} entries "
            f"and 'row_idx' {len(row_idx)}"
        )
    col_ptr = get["col_ptr"].to(torch.int64)
    if (
        int(col_off[0]) != 0
        or len(col_ptr) != int(col_off[-1])
        or not torch.equal(col_off.diff(), in_hi - in_lo + 1)
    ):
        raise fail(f"array 'col_ptr_off' does not give each PE its input range + 1 of {len(col_ptr)} entries")
    if pes and (
        not torch.equal(col_ptr[col_off[:-1]], torch.zeros_like(out_lo))
        or not torch.equal(col_ptr[col_off[1:] - 1], nz_ptr.diff())
    ):
        raise fail("array 'col_ptr' does not run from 0 to each PE's nnz")
    steps = col_ptr.diff()
    inside = torch.ones_like(steps, dtype=torch.bool)
    inside[col_off[1:-1] - 1] = False  # the step from a PE's last entry to the next PE's first
    if bool((steps[inside] < 0).any()):
        raise fail("array 'col_ptr' decreases inside a PE")
    if not values.is_floating_point():
        raise fail(f"array 'values' has dtype {values.dtype}; a weight is floating point")
    return Slices(
        in_features,
        out_features,
        nz_ptr,
        col_off,
        col_ptr,
        row_idx,
        values,
        out_lo,
        span,
        in_lo,
        in_hi,
        where,
        tuple(arrays[role] for role in sorted(arrays) if role != "bias"),
    )


def _groups(s: Slices) -> list[tuple[int, int]]:
    """Runs ``[p0, p1)`` of PEs holding about ``CHUNK_ELEMENTS`` nonzeros and column entries each."""
    cost = s.nz_ptr.diff() + s.col_ptr_off.diff()
    before = torch.cumsum(cost, 0) - cost
    sizes = torch.unique_consecutive(before // CHUNK_ELEMENTS, return_counts=True)[1]
    ends = torch.cumsum(sizes, 0).tolist()
    return list(zip([0] + ends[:-1], ends))


def _group_indices(s: Slices, p0: int, p1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For PEs ``[p0, p1)``, per nonzero: its input feature and its output."""
    dev = s.nz_ptr.device
    pe = torch.arange(p0, p1, device=dev)
    n0, n1 = int(s.nz_ptr[p0]), int(s.nz_ptr[p1])
    e0, e1 = int(s.col_ptr_off[p0]), int(s.col_ptr_off[p1])
    entries = s.col_ptr_off[p0 + 1 : p1 + 1] - s.col_ptr_off[p0:p1]  # input range + 1 per PE
    pe_of_entry = torch.repeat_interleave(pe, entries, output_size=e1 - e0)
    local = torch.arange(e0, e1, device=dev) - s.col_ptr_off[pe_of_entry]
    is_column = local < entries[pe_of_entry - p0] - 1  # every entry but a PE's last opens a column
    counts = s.col_ptr[e0:e1].diff()[is_column[:-1]]
    feature = torch.repeat_interleave((s.in_lo[pe_of_entry] + local)[is_column], counts, output_size=n1 - n0)
    pe_of_nz = torch.repeat_interleave(pe, s.nz_ptr[p0 + 1 : p1 + 1] - s.nz_ptr[p0:p1], output_size=n1 - n0)
    row = s.row_idx[n0:n1].to(torch.int64)
    if n1 > n0 and bool(((row < 0) | (row >= s.span[pe_of_nz])).any()):
        raise EmulationError(f"{s.where}: a row index of PEs {p0}..{p1 - 1} leaves its PE's output range")
    output = (s.out_lo[pe_of_nz] + row) % max(s.out_features, 1)
    return feature, output


def _indices(s: Slices) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each nonzero's input feature and output, and the nonzeros by output: PE by PE and in input order
    within a PE (``_merged``). A row index outside its PE's output range is an ``EmulationError``."""
    if compiled.available(s.nz_ptr, s.row_idx):
        args = (s.nz_ptr, s.col_ptr_off, s.col_ptr, s.row_idx, s.in_lo, s.out_lo, s.span, s.out_features)
        got = compiled.merge_order(*args)
        if isinstance(got, int):
            raise EmulationError(f"{s.where}: a row index of PE {got} leaves its PE's output range")
        return got
    features, outputs = [], []
    for p0, p1 in _groups(s):
        feature, output = _group_indices(s, p0, p1)
        features.append(feature)
        outputs.append(output)
    feature, output = torch.cat(features), torch.cat(outputs)
    return feature, output, torch.argsort(output, stable=True)


def _merged(s: Slices, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Every PE's nonzeros as one CSR matrix ``[out, in]`` on ``device``: row ``o`` holds the nonzeros of
    output ``o``, PE by PE and within a PE in input order, so a row's dot product adds each PE's AXPY
    terms in the order its PE does and then the PEs' partial sums one after another (the reduction,
    reassociated). Built once per slices' arrays and kept while they live (``runtime/memo.py``)."""
    arrays = tuple((id(t), t._version) for t in s.sources)  # another array swapped in: merged again
    return kept(s.values, ("merged", device, dtype, arrays), lambda: _merge(s, device, dtype))


def _merge(s: Slices, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    feature, output, order = _indices(s)
    index = torch.int32 if max(s.in_features, len(feature)) < 2**31 else torch.int64
    crow = torch.zeros(s.out_features + 1, dtype=index, device=output.device)
    torch.cumsum(torch.bincount(output, minlength=s.out_features), 0, out=crow[1:])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
        matrix = torch.sparse_csr_tensor(
            crow,
            feature[order].to(index),
            s.values.to(dtype)[order],
            size=(s.out_features, s.in_features),
            check_invariants=False,
        ).to(device)
    return matrix


def product(s: Slices, x: torch.Tensor) -> torch.Tensor:
    """``[rows, in] -> [rows, out]``: each output's nonzeros times their inputs, summed PE by PE.

    The PEs' nonzeros are merged into one CSR matrix once (``_merged``), then rows go in chunks of at
    most 256. Half-precision inputs are computed in float32 and the result cast back.
    """
    if x.dim() != 2 or x.shape[1] != s.in_features:
        raise EmulationError(f"{s.where}: input of shape {list(x.shape)} is not [rows, {s.in_features}]")
    result_dtype = torch.promote_types(x.dtype, s.values.dtype)
    dtype = torch.float32 if result_dtype in (torch.float16, torch.bfloat16) else result_dtype
    rows = x.shape[0]
    out = torch.empty(rows, s.out_features, dtype=dtype, device=x.device)
    if len(s.values) == 0:
        return out.zero_().to(result_dtype)
    matrix = _merged(s, x.device, dtype)
    step = max(1, min(rows, _ROWS_PER_CHUNK))
    for r in range(0, rows, step):
        xt = x[r : r + step].to(dtype).t().contiguous()  # [in, b]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
            out[r : r + step] = (matrix @ xt).t()
    return out.to(result_dtype)


Product = Callable[[Slices, torch.Tensor], torch.Tensor]
"""``(slices, x [rows, in]) -> [rows, out]``: how a sparse product is computed (``product`` by default)."""


def _tuple(value: int | Sequence[int], n: int, name: str, where: str) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * n
    if isinstance(value, (list, tuple)) and len(value) in (1, n) and all(isinstance(v, int) for v in value):
        return tuple(value) * (n // len(value))
    raise EmulationError(f"{where}: attribute {name}={value!r} is not {n} integers")


def _conv(
    s: Slices,
    x: torch.Tensor,
    attrs: Mapping,
    shape: tuple[int, ...],
    finish: Callable[[torch.Tensor], torch.Tensor],
    product: Product,
) -> torch.Tensor:
    """im2col, the sparse product, ``finish`` (bias) on each ``[rows, out]`` chunk, the fold to ``shape``."""
    dims = 2 if attrs["kind"] == "conv2d" else 1
    where = s.where
    if x.dim() not in (dims + 1, dims + 2):
        raise EmulationError(f"{where}: a {attrs['kind']} input of shape {list(x.shape)} has the wrong rank")
    batched = x.dim() == dims + 2
    x = x if batched else x.unsqueeze(0)
    params = [
        _tuple(attrs.get(k, d), dims, k, where) for k, d in (("stride", 1), ("padding", 0), ("dilation", 1))
    ]
    kernel = _tuple(attrs.get("kernel_size"), dims, "kernel_size", where)
    if x.shape[1] * math.prod(kernel) != s.in_features:
        raise EmulationError(
            f"{where}: {x.shape[1]} channels x kernel {list(kernel)} is not in_features {s.in_features}"
        )
    if dims == 1:  # the 1-D im2col is the 2-D one on a height-1 image
        x = x.unsqueeze(2)
        kernel, params = (1, *kernel), [(d, *p) for p, d in zip(params, (1, 0, 1))]
    stride, padding, dilation = params
    spatial = tuple(shape[-dims:])
    positions = math.prod(spatial)
    batch = max(1, CHUNK_ELEMENTS * 4 // max(1, positions * max(s.in_features, s.out_features)))
    pieces = []
    for n0 in range(0, x.shape[0], batch):
        cols = F.unfold(x[n0 : n0 + batch], kernel, dilation=dilation, padding=padding, stride=stride)
        if cols.shape[2] != positions:
            raise EmulationError(
                f"{where}: the convolution gives {cols.shape[2]} positions; the kernel's is {list(shape)}"
            )
        flat = finish(product(s, cols.transpose(1, 2).reshape(-1, s.in_features)))
        pieces.append(flat.view(cols.shape[0], positions, s.out_features).transpose(1, 2))
    out = torch.cat(pieces).reshape(x.shape[0], s.out_features, *spatial)
    return out if batched else out.squeeze(0)


def _slices(
    arrays: Mapping[str, torch.Tensor], in_f: int, out_f: int, region: tuple[int, int], where: str
) -> Slices:
    """``read_slices``, read and checked once per set of arrays (identity and version of each)."""
    if "values" not in arrays:
        return read_slices(arrays, in_f, out_f, region[0], region[1], where)
    given = tuple((role, id(t), t._version) for role, t in sorted(arrays.items()) if role != "bias")
    key = ("slices", given, in_f, out_f, region)
    return kept(arrays["values"], key, lambda: read_slices(arrays, in_f, out_f, region[0], region[1], where))


def sparse_matmul(
    arrays: Mapping[str, torch.Tensor],
    attrs: Mapping,
    region: tuple[int, int],
    x: torch.Tensor,
    shape: tuple[int, ...],
    where: str,
    product: Product = product,
) -> torch.Tensor:
    """A ``sparse_matmul`` kernel's result of ``shape`` from its arrays (by role) and attrs.

    ``region`` is ``(width, height)``. ``kind`` ``linear``/``matmul`` read ``[..., in]``, ``addmm``
    ``[rows, in]``, ``conv1d``/``conv2d`` images; the bias (array ``bias``, one per output) comes
    last. Bad attrs or arrays are an ``EmulationError`` naming ``where``. ``product`` computes the
    ``[rows, in] -> [rows, out]`` products (the reference executor passes its PEs' own AXPYs).
    """
    kind = attrs.get("kind")
    if kind not in ("linear", "addmm", "matmul", "conv1d", "conv2d"):
        raise EmulationError(
            f"{where}: sparse_matmul kind {kind!r} is not linear, addmm, matmul, conv1d or conv2d"
        )
    try:
        in_f, out_f = int(attrs["in_features"]), int(attrs["out_features"])
    except (KeyError, TypeError, ValueError):
        raise EmulationError(f"{where}: attrs in_features/out_features are missing or not integers") from None
    s = _slices(arrays, in_f, out_f, region, where)
    bias = arrays.get("bias")
    alpha, beta = (attrs.get("alpha", 1), attrs.get("beta", 1)) if kind == "addmm" else (1, 1)
    if not all(isinstance(v, (int, float)) for v in (alpha, beta)):
        raise EmulationError(f"{where}: attrs alpha={alpha!r}, beta={beta!r} are not numbers")
    if bias is not None and bias.numel() != out_f:
        raise EmulationError(f"{where}: array 'bias' has {bias.numel()} entries; it needs {out_f}")

    def finish(flat: torch.Tensor) -> torch.Tensor:
        if alpha != 1:
            flat = flat * alpha
        if bias is None or beta == 0:  # as torch.addmm: a zero beta ignores the bias, NaN included
            return flat
        b = bias.to(flat.dtype)
        return flat + (b * beta if beta != 1 else b)

    if kind in ("conv1d", "conv2d"):
        if len(shape) < (3 if kind == "conv2d" else 2):
            raise EmulationError(f"{where}: a {kind} result of shape {list(shape)} has the wrong rank")
        out = _conv(s, x, attrs, shape, finish, product)
        rows = out.numel() // max(out_f, 1)
    else:
        if x.dim() == 0 or x.shape[-1] != in_f or (kind == "addmm" and x.dim() != 2):
            raise EmulationError(f"{where}: a {kind} input of shape {list(x.shape)} does not end in {in_f}")
        out = finish(product(s, x.reshape(-1, in_f)))
        rows = out.shape[0]
        out = out.reshape(*x.shape[:-1], out_f)
    if "rows" in attrs and attrs["rows"] != rows:
        raise EmulationError(f"{where}: computes {rows} rows; the kernel was lowered for {attrs['rows']}")
    return _epilogue(out, attrs.get("epilogue"), where)


def _epilogue(out: torch.Tensor, epilogue: Any, where: str) -> torch.Tensor:
    """``out`` through the activation ``attrs["epilogue"]`` names (``cost.EPILOGUES``), if any."""
    if epilogue is None:
        return out
    if not isinstance(epilogue, Mapping) or epilogue.get("fn") not in EPILOGUES:
        raise EmulationError(f"{where}: epilogue {epilogue!r} is not one of {sorted(EPILOGUES)}")
    kwargs = epilogue.get("kwargs", {})
    if not isinstance(kwargs, Mapping):
        raise EmulationError(f"{where}: epilogue kwargs {kwargs!r} are not a mapping")
    return call(str(epilogue["fn"]), [out], dict(kwargs), where)
