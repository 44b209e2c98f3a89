"""Float32 vectors as numba values (16 lanes, and 8), so that a loop keeps its sums in registers.

numba has no vector type: a loop that adds into an array row loads and stores the row at every
product, and LLVM cannot keep sixteen scalar sums in one register across a loop. A vector here is
an LLVM ``<16 x float>`` (``..16`` ops) or ``<8 x float>`` (``..8`` ops) value: LLVM maps it onto the
machine's registers (one AVX-512 or two AVX2 ones for 16 lanes, four NEON ones). The intrinsics are
the few operations the frozen kernels need. Loads and
stores take a 1-D float32 array and the index of the first lane; they do not check bounds (the
kernels index packed weights that ``PackedWeight.check`` has checked). ``lookup32`` is the one
machine-specific op (AVX-512). Importing this needs numba;
the ops only run compiled, so their examples are the kernels themselves (``loops.tiles``).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

__all__ = [
    "splat16",
    "load16",
    "store16",
    "fmuladd16",
    "add16",
    "splat8",
    "load8",
    "store8",
    "fmuladd8",
    "add8",
    "lookup32",
]


def _vector_ops(lanes: int) -> tuple:
    """numba's type for a ``<lanes x float>`` value, and ``(splat, load, store, scatter, fmuladd, add,
    fmuladd_lanes, gather, total)`` on it."""
    vector = ir.VectorType(ir.FloatType(), lanes)

    class F32xN(types.Type):
        def __init__(self) -> None:
            super().__init__(name=f"f32x{lanes}")

    vtype = F32xN()

    @register_model(F32xN)
    class _Model(models.PrimitiveModel):
        def __init__(self, dmm, fe_type) -> None:  # noqa: ANN001 - numba's signature
            super().__init__(dmm, fe_type, vector)

    def broadcast(builder, value):  # noqa: ANN001, ANN202 - numba codegen
        first = builder.insert_element(
            ir.Constant(vector, ir.Undefined), value, ir.Constant(ir.IntType(32), 0)
        )
        zeros = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)
        return builder.shuffle_vector(first, ir.Constant(vector, ir.Undefined), zeros)

    def lane_pointer(context, builder, array_type, array, index):  # noqa: ANN001, ANN202
        data = context.make_array(array_type)(context, builder, array).data
        return builder.bitcast(builder.gep(data, [index]), vector.as_pointer())

    @intrinsic
    def splat(typingctx, value):  # noqa: ANN001, ANN202 - numba intrinsic
        """``lanes`` copies of a float32."""
        return vtype(types.float32), lambda context, builder, sig, args: broadcast(builder, args[0])

    @intrinsic
    def load(typingctx, array, index):  # noqa: ANN001, ANN202
        """``array[index : index + lanes]`` (a contiguous 1-D float32 array)."""

        def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
            return builder.load(lane_pointer(context, builder, sig.args[0], args[0], args[1]), align=4)

        return vtype(array, index), codegen

    @intrinsic
    def store(typingctx, array, index, value):  # noqa: ANN001, ANN202
        """``array[index : index + lanes] = value``."""

        def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
            builder.store(args[2], lane_pointer(context, builder, sig.args[0], args[0], args[1]), align=4)
            return context.get_dummy_value()

        return types.none(array, index, value), codegen

    @intrinsic
    def scatter(typingctx, array, index, stride, value):  # noqa: ANN001, ANN202
        """``array[index + k * stride] = value[k]`` for each lane ``k``: a column of a row-major
        matrix (a tile's sums into a token-major output)."""

        def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            at, step = args[1], args[2]
            for k in range(lanes):
                lane = builder.extract_element(args[3], ir.Constant(ir.IntType(32), k))
                builder.store(lane, builder.gep(data, [at]))
                at = builder.add(at, step)
            return context.get_dummy_value()

        return types.none(array, index, stride, value), codegen

    @intrinsic
    def fmuladd(typingctx, acc, weight, x):  # noqa: ANN001, ANN202
        """``acc + weight * x`` lane by lane, fused where the machine has FMA (``llvm.fmuladd``)."""

        def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
            fnty = ir.FunctionType(vector, [vector] * 3)
            fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.fmuladd.v{lanes}f32")
            return builder.call(fn, [broadcast(builder, args[1]), args[2], args[0]])

        return vtype(acc, types.float32, x), codegen

    @intrinsic
    def fmuladd_lanes(typingctx, acc, weights, x):  # noqa: ANN001, ANN202
        """``acc + weights * x``, all three vectors."""

        def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
            fnty = ir.FunctionType(vector, [vector] * 3)
            fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.fmuladd.v{lanes}f32")
            return builder.call(fn, [args[1], args[2], args[0]])

        return vtype(acc, weights, x), codegen

    @intrinsic
    def gather(typingctx, array, indices, start):  # noqa: ANN001, ANN202
        """``array[indices[start + k]]`` for each lane ``k`` (unsigned indices, a 1-D float32 array)."""

        def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            where = context.make_array(sig.args[1])(context, builder, args[1]).data
            lanes_value = ir.Constant(vector, ir.Undefined)
            for k in range(lanes):
                at = builder.add(args[2], ir.Constant(args[2].type, k))
                index = builder.zext(builder.load(builder.gep(where, [at])), ir.IntType(64))
                element = builder.load(builder.gep(data, [index]))
                lanes_value = builder.insert_element(lanes_value, element, ir.Constant(ir.IntType(32), k))
            return lanes_value

        return vtype(array, indices, start), codegen

    @intrinsic
    def total(typingctx, value):  # noqa: ANN001, ANN202
        """The sum of the lanes, halved pairwise."""

        def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
            x, n = args[0], lanes
            while n > 1:
                n //= 2
                low = ir.Constant(ir.VectorType(ir.IntType(32), n), list(range(n)))
                high = ir.Constant(ir.VectorType(ir.IntType(32), n), list(range(n, 2 * n)))
                x = builder.fadd(builder.shuffle_vector(x, x, low), builder.shuffle_vector(x, x, high))
            return builder.extract_element(x, ir.Constant(ir.IntType(32), 0))

        return types.float32(value), codegen

    @intrinsic
    def add(typingctx, a, b):  # noqa: ANN001, ANN202
        """``a + b`` lane by lane."""
        return vtype(a, b), lambda context, builder, sig, args: builder.fadd(args[0], args[1])

    return splat, load, store, scatter, fmuladd, add, fmuladd_lanes, gather, total


splat16, load16, store16, scatter16, fmuladd16, add16, fmuladd_lanes16, gather16, total16 = _vector_ops(16)
splat8, load8, store8, scatter8, fmuladd8, add8, *_ = _vector_ops(8)


@intrinsic
def lookup32(typingctx, low, positions, start, high):  # noqa: ANN001, ANN202 - numba intrinsic
    """Lane ``k``: lane ``positions[start + k]`` (a uint8 from 0 to 31) of the 32 floats ``low`` then
    ``high``, two 16-lane vectors: a table lookup in registers, one AVX-512 instruction (``vpermt2ps``).
    Only a machine with AVX-512 compiles it (``lookup.supported``)."""
    vector, lanes32 = ir.VectorType(ir.FloatType(), 16), ir.VectorType(ir.IntType(32), 16)
    bytes16 = ir.VectorType(ir.IntType(8), 16)

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        data = context.make_array(sig.args[1])(context, builder, args[1]).data
        where = builder.bitcast(builder.gep(data, [args[2]]), bytes16.as_pointer())
        index = builder.zext(builder.load(where, align=1), lanes32)
        fnty = ir.FunctionType(vector, [vector, lanes32, vector])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.vpermi2var.ps.512")
        return builder.call(fn, [args[0], index, args[3]])

    return low(low, positions, start, high), codegen
