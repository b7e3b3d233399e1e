"""The CPU inference kernel's inner loop, written as LLVM vector code (numba intrinsics).

A *section* is one input neuron's ``LANES`` activations of a tile of rows (contiguous). The
intrinsics accumulate, for one output column or for ``GROUP`` columns that have the same inputs,
``sum_p w_p * section(j_p)`` over the column's weight entries whose section is flagged nonzero.
The accumulators are vectors of ``VECTOR_BYTES`` held in registers for the whole column and
updated with fused multiply-adds (``llvm.fmuladd``, an FMA instruction where the CPU has one),
so a column's sum is the same whichever intrinsic computes it. A group loads each section once
for its ``GROUP`` columns: 4 vector loads feed 16 multiply-adds on AVX-512.
docs/challenge.md ("The kernel").
"""

from __future__ import annotations

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils, config
from numba.extending import intrinsic

__all__ = [
    "ACCUMULATOR_BYTES",
    "GROUP",
    "LANES",
    "VECTOR_BYTES",
    "accumulate_column",
    "accumulate_group",
    "accumulator_bytes",
    "aligned_copy",
    "aligned_empty",
    "register_bytes",
    "stack_group",
]

LANES = 64  # rows per tile: 4 AVX-512 (8 AVX2) float32 vectors per section
GROUP = 4  # columns with the same inputs accumulated together: 16 AVX-512 accumulators (float32)
VECTOR_BYTES = 64  # one AVX-512 register; LLVM splits the vectors on narrower machines


def register_bytes(features: str | None = None) -> int:
    """Bytes of one vector register of the CPU numba compiles for: 64 with AVX-512, 32 with AVX,
    else 16. ``features``: LLVM's feature string (default ``NUMBA_CPU_FEATURES``, else the
    host's)."""
    if features is None:
        features = config.CPU_FEATURES or llvm.get_host_cpu_features().flatten()
    enabled = {f[1:] for f in features.split(",") if f.startswith("+")}
    return 64 if "avx512f" in enabled else 32 if "avx" in enabled else 16


def accumulator_bytes(features: str | None = None) -> int:
    """Bytes of accumulators a pass keeps in registers: half the vector register file (16 of
    AVX-512's 32 registers, 4 float32 columns of 64 lanes; 8 of the 16 of AVX or SSE, one
    column). ``features`` as for :func:`register_bytes`."""
    width = register_bytes(features)
    return width * (16 if width == 64 else 8)


ACCUMULATOR_BYTES = accumulator_bytes()


def aligned_empty(shape: tuple[int, ...], dtype, boundary: int = VECTOR_BYTES) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a multiple of ``boundary`` bytes
    (numpy's large arrays start 16 bytes into a page: a 64-byte vector load from one straddles
    two cache lines)."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(count + boundary, dtype=np.uint8)
    skip = -raw.ctypes.data % boundary
    return raw[skip : skip + count].view(dtype).reshape(shape)


def aligned_copy(array: np.ndarray, boundary: int = VECTOR_BYTES) -> np.ndarray:
    """A C-contiguous copy of ``array`` in an :func:`aligned_empty` array."""
    out = aligned_empty(array.shape, array.dtype, boundary)
    out[...] = array
    return out

_I64 = ir.IntType(64)


@intrinsic
def stack_group(typingctx, dtype):
    """A ``GROUP * LANES`` scratch buffer of ``dtype`` on the stack (row ``m``: column ``m``)."""
    element = dtype.dtype

    def codegen(context, builder, signature, args):
        return cgutils.alloca_once(builder, context.get_value_type(element), size=GROUP * LANES)

    return types.CPointer(element)(dtype), codegen


def _emit_accumulate(context, builder, signature, args, columns: int):
    """Code of the accumulation of ``columns`` columns; see :func:`accumulate_group`."""
    out, src, base, indices, data, flags, flag_base, lo, hi = args[:9]
    deltas = [None, *args[9:]]
    src_ty, indices_ty, data_ty, flags_ty = (signature.args[i] for i in (1, 3, 4, 5))
    src_ptr = context.make_array(src_ty)(context, builder, src).data
    indices_ptr = context.make_array(indices_ty)(context, builder, indices).data
    data_ptr = context.make_array(data_ty)(context, builder, data).data
    flags_ptr = context.make_array(flags_ty)(context, builder, flags).data
    element = context.get_value_type(src_ty.dtype)
    itemsize = context.get_abi_sizeof(element)
    width = VECTOR_BYTES // itemsize
    vector = ir.VectorType(element, width)
    fmuladd = cgutils.get_or_insert_function(
        builder.module,
        ir.FunctionType(vector, [vector, vector, vector]),
        f"llvm.fmuladd.v{width}{'f32' if itemsize == 4 else 'f64'}",
    )
    broadcast = ir.Constant(ir.VectorType(ir.IntType(32), width), [0] * width)
    undefined = ir.Constant(vector, ir.Undefined)
    zero = ir.Constant(vector, None)
    n_vectors = LANES // width
    terms = cgutils.alloca_once_value(builder, _I64(0))
    flags_row = builder.gep(flags_ptr, [flag_base])
    tile = builder.gep(src_ptr, [base])
    per_pass = max(1, min(columns, ACCUMULATOR_BYTES // (LANES * itemsize)))
    for first in range(0, columns, per_pass):  # more passes read each section again
        batch = range(first, min(columns, first + per_pass))
        sums = {  # whole-vector slots only: LLVM turns them into registers
            column: [cgutils.alloca_once_value(builder, zero) for _ in range(n_vectors)]
            for column in batch
        }
        with cgutils.for_range_slice(builder, lo, hi, _I64(1), inc=True) as (p, _):
            j = builder.load(builder.gep(indices_ptr, [p]))
            j = builder.sext(j, _I64) if j.type.width < 64 else j
            flag = builder.load(builder.gep(flags_row, [j]))
            with builder.if_then(builder.icmp_unsigned("!=", flag, flag.type(0)), likely=True):
                section = builder.gep(tile, [builder.mul(j, _I64(LANES))])
                parts = [
                    builder.load(
                        builder.bitcast(builder.gep(section, [_I64(k * width)]),
                                        vector.as_pointer()),
                        align=itemsize,
                    )
                    for k in range(n_vectors)
                ]
                for column in batch:
                    at = p if column == 0 else builder.add(p, deltas[column])
                    weight = builder.load(builder.gep(data_ptr, [at]))
                    weight = builder.shuffle_vector(
                        builder.insert_element(undefined, weight, _I64(0)), undefined, broadcast
                    )
                    for k, part in enumerate(parts):
                        slot = sums[column][k]
                        builder.store(builder.call(fmuladd, [weight, part, builder.load(slot)]),
                                      slot)
                if first == 0:
                    builder.store(builder.add(builder.load(terms), _I64(1)), terms)
        for column in batch:
            for k in range(n_vectors):
                at = builder.gep(out, [_I64(column * LANES + k * width)])
                builder.store(builder.load(sums[column][k]),
                              builder.bitcast(at, vector.as_pointer()), align=itemsize)
    return builder.load(terms)


@intrinsic
def accumulate_column(typingctx, out, src, base, indices, data, flags, flag_base, lo, hi):
    """``out[:LANES] = sum over p in [lo, hi) if flags.flat[flag_base + j] of data[p] *
    src.flat[base + j * LANES:][:LANES]``, ``j = indices[p]``; returns the terms added.

    ``out``: a :func:`stack_group` buffer; ``src``: a C-contiguous array of tiles
    (``base``: the tile's first element); ``flags``: C-contiguous booleans, one per section.
    """

    def codegen(context, builder, signature, args):
        return _emit_accumulate(context, builder, signature, args, 1)

    signature = types.int64(out, src, types.int64, indices, data, flags, types.int64,
                            types.int64, types.int64)
    return signature, codegen


@intrinsic
def accumulate_group(typingctx, out, src, base, indices, data, flags, flag_base, lo, hi,
                     delta1, delta2, delta3):
    """:func:`accumulate_column` for ``GROUP`` columns with the same inputs in the same order:
    column ``m``'s weights are ``data[p + delta_m]`` (``delta_0 = 0``), its sum goes to
    ``out[m * LANES:][:LANES]``; returns the terms added for one column."""

    def codegen(context, builder, signature, args):
        return _emit_accumulate(context, builder, signature, args, GROUP)

    signature = types.int64(out, src, types.int64, indices, data, flags, types.int64,
                            types.int64, types.int64, types.int64, types.int64, types.int64)
    return signature, codegen
