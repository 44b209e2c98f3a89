"""Sixteen float32 lanes as a numba value, so that a loop keeps its sums in vector registers.

numba has no vector type: a loop that adds into an array row loads and stores the row at every
product, and LLVM cannot keep sixteen scalar sums in one register across a loop. ``F32x16`` is an
LLVM ``<16 x float>`` value (two AVX2 registers, one AVX-512 register, four NEON ones: LLVM splits it
for the machine), and the intrinsics below are the few operations the frozen kernels need. Loads and
stores take a 1-D float32 array and the index of the first lane; they do not check bounds (the
kernels index packed weights that ``PackedWeight.check`` has checked). Importing this needs numba;
the ops only run compiled, so their examples are the kernels themselves (``loops.tiles``).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

__all__ = ["LANES", "splat", "load", "store", "fmuladd", "add"]

LANES = 16
_VECTOR = ir.VectorType(ir.FloatType(), LANES)


class F32x16(types.Type):
    """numba's type for one ``<16 x float>`` value."""

    def __init__(self) -> None:
        super().__init__(name="f32x16")


f32x16 = F32x16()


@register_model(F32x16)
class _Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type) -> None:  # noqa: ANN001 - numba's signature
        super().__init__(dmm, fe_type, _VECTOR)


def _broadcast(builder, value):  # noqa: ANN001, ANN202 - numba codegen
    first = builder.insert_element(ir.Constant(_VECTOR, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    zeros = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
    return builder.shuffle_vector(first, ir.Constant(_VECTOR, ir.Undefined), zeros)


def _lane_pointer(context, builder, array_type, array, index):  # noqa: ANN001, ANN202 - numba codegen
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [index]), _VECTOR.as_pointer())


@intrinsic
def splat(typingctx, value):  # noqa: ANN001, ANN201 - numba intrinsic
    """Sixteen copies of a float32."""

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        one = builder.insert_element(
            ir.Constant(_VECTOR, ir.Undefined), args[0], ir.Constant(ir.IntType(32), 0)
        )
        zeros = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
        return builder.shuffle_vector(one, ir.Constant(_VECTOR, ir.Undefined), zeros)

    return f32x16(types.float32), codegen


@intrinsic
def load(typingctx, array, index):  # noqa: ANN001, ANN201 - numba intrinsic
    """``array[index : index + 16]`` (a contiguous 1-D float32 array)."""

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        return builder.load(_lane_pointer(context, builder, sig.args[0], args[0], args[1]), align=4)

    return f32x16(array, index), codegen


@intrinsic
def store(typingctx, array, index, vector):  # noqa: ANN001, ANN201 - numba intrinsic
    """``array[index : index + 16] = vector``."""

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        builder.store(args[2], _lane_pointer(context, builder, sig.args[0], args[0], args[1]), align=4)
        return context.get_dummy_value()

    return types.none(array, index, vector), codegen


@intrinsic
def fmuladd(typingctx, acc, weight, x):  # noqa: ANN001, ANN201 - numba intrinsic
    """``acc + weight * x`` lane by lane, fused where the machine has FMA (``llvm.fmuladd``)."""

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_VECTOR, [_VECTOR] * 3), f"llvm.fmuladd.v{LANES}f32"
        )
        one = builder.insert_element(
            ir.Constant(_VECTOR, ir.Undefined), args[1], ir.Constant(ir.IntType(32), 0)
        )
        zeros = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
        w = builder.shuffle_vector(one, ir.Constant(_VECTOR, ir.Undefined), zeros)
        return builder.call(fn, [w, args[2], args[0]])

    return f32x16(acc, types.float32, x), codegen


@intrinsic
def add(typingctx, a, b):  # noqa: ANN001, ANN201 - numba intrinsic
    """``a + b`` lane by lane."""

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        return builder.fadd(args[0], args[1])

    return f32x16(a, b), codegen
