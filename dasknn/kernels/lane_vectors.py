"""The CPU kernels' inner loops, written as LLVM vector code (numba intrinsics).

Inference (:mod:`dasknn.kernels.inference`): a *section* is one input neuron's ``LANES``
activations of a tile of rows (contiguous). The intrinsics accumulate, for one output column or
for ``GROUP`` columns that have the same inputs, ``sum_p w_p * section(j_p)`` over the column's
weight entries whose section is flagged nonzero. The accumulators are vectors of
``VECTOR_BYTES`` held in registers for the whole column and updated with fused multiply-adds
(``llvm.fmuladd``, an FMA instruction where the CPU has one), so a column's sum is the same
whichever intrinsic computes it. A group loads each section once for its ``GROUP`` columns: 4
vector loads feed 16 multiply-adds on AVX-512.
docs/challenge.md ("The kernel").

Training (:mod:`dasknn.kernels.training`), on feature-major arrays (one row of ``B`` samples a
neuron): :func:`accumulate_rows` sums ``w_p * row(j_p)`` over a run of entries into accumulators
held in registers for the whole run (one load a multiply-add, where a scatter into the output
row costs two loads and a store), and :func:`dot_rows` keeps one row in registers while it takes
its dot products with a run of others. Both work on ``n_vectors`` consecutive vectors of the rows,
1 to :data:`ROW_VECTORS` (the accumulators of one pass), chosen at run time; the caller walks the
batch in such chunks.
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
    "ROW_VECTORS",
    "accumulate_column",
    "accumulate_group",
    "accumulate_rows",
    "accumulator_bytes",
    "aligned_copy",
    "aligned_empty",
    "dot_rows",
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
#: Vectors of ``VECTOR_BYTES`` in one pass of the training intrinsics (16 with AVX-512, else 4).
ROW_VECTORS = ACCUMULATOR_BYTES // VECTOR_BYTES


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


def _vectors(context, builder, dtype):
    """``(vector type, lanes, fmuladd)`` for ``VECTOR_BYTES`` vectors of ``dtype``."""
    element = context.get_value_type(dtype)
    itemsize = context.get_abi_sizeof(element)
    width = VECTOR_BYTES // itemsize
    vector = ir.VectorType(element, width)
    fmuladd = cgutils.get_or_insert_function(
        builder.module,
        ir.FunctionType(vector, [vector, vector, vector]),
        f"llvm.fmuladd.v{width}{'f32' if itemsize == 4 else 'f64'}",
    )
    return vector, width, fmuladd


def _splat(builder, vector, value):
    """``value`` in every lane of ``vector``."""
    undefined = ir.Constant(vector, ir.Undefined)
    lanes = ir.Constant(ir.VectorType(ir.IntType(32), vector.count), [0] * vector.count)
    return builder.shuffle_vector(builder.insert_element(undefined, value, _I64(0)), undefined,
                                  lanes)


def _vector_at(builder, pointer, offset: int, vector):
    """Pointer to the ``vector`` starting ``offset`` elements after ``pointer``."""
    return builder.bitcast(builder.gep(pointer, [_I64(offset)]), vector.as_pointer())


def _index(builder, pointer, p):
    """``pointer[p]`` widened to 64 bits."""
    j = builder.load(builder.gep(pointer, [p]))
    return builder.sext(j, _I64) if j.type.width < 64 else j


def _data(context, builder, array_type, array):
    return context.make_array(array_type)(context, builder, array).data


def _emit_accumulate(context, builder, signature, args, columns: int):
    """Code of the accumulation of ``columns`` columns; see :func:`accumulate_group`."""
    out, src, base, indices, data, flags, flag_base, lo, hi = args[:9]
    deltas = [None, *args[9:]]
    src_ty, indices_ty, data_ty, flags_ty = (signature.args[i] for i in (1, 3, 4, 5))
    src_ptr = _data(context, builder, src_ty, src)
    indices_ptr = _data(context, builder, indices_ty, indices)
    data_ptr = _data(context, builder, data_ty, data)
    flags_ptr = _data(context, builder, flags_ty, flags)
    vector, width, fmuladd = _vectors(context, builder, src_ty.dtype)
    itemsize = VECTOR_BYTES // width
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
            j = _index(builder, indices_ptr, p)
            flag = builder.load(builder.gep(flags_row, [j]))
            with builder.if_then(builder.icmp_unsigned("!=", flag, flag.type(0)), likely=True):
                section = builder.gep(tile, [builder.mul(j, _I64(LANES))])
                parts = [builder.load(_vector_at(builder, section, k * width, vector),
                                      align=itemsize) for k in range(n_vectors)]
                for column in batch:
                    at = p if column == 0 else builder.add(p, deltas[column])
                    weight = _splat(builder, vector, builder.load(builder.gep(data_ptr, [at])))
                    for k, part in enumerate(parts):
                        slot = sums[column][k]
                        builder.store(builder.call(fmuladd, [weight, part, builder.load(slot)]),
                                      slot)
                if first == 0:
                    builder.store(builder.add(builder.load(terms), _I64(1)), terms)
        for column in batch:
            for k in range(n_vectors):
                builder.store(builder.load(sums[column][k]),
                              _vector_at(builder, out, column * LANES + k * width, vector),
                              align=itemsize)
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


def _row_array(name: str, array_type) -> None:
    """Refuse (at compile time) an array the row intrinsics cannot walk by its shape."""
    if not isinstance(array_type, types.Array) or array_type.layout != "C":
        raise TypeError(f"{name} must be a C-contiguous array, got {array_type}")


def _rows_pointer(context, builder, array_type, array, t0):
    """``(pointer to element t0 of row 0, row length)`` of a C-contiguous 2-D array."""
    value = context.make_array(array_type)(context, builder, array)
    stride = builder.extract_value(value.shape, 1)
    return builder.gep(value.data, [t0]), stride


def _horizontal_sum(builder, value):
    """The sum of the lanes of ``value`` (halving, pairwise)."""
    while value.type.count > 1:
        half = value.type.count // 2
        low = builder.shuffle_vector(value, value, ir.Constant(
            ir.VectorType(ir.IntType(32), half), list(range(half))))
        high = builder.shuffle_vector(value, value, ir.Constant(
            ir.VectorType(ir.IntType(32), half), list(range(half, 2 * half))))
        value = builder.fadd(low, high)
    return builder.extract_element(value, _I64(0))


def _by_vector_count(builder, count, emit) -> None:
    """Code branching on the runtime ``count`` (1 to ``ROW_VECTORS``) to ``emit(n)``, the code
    for ``n`` vectors; nothing for other counts."""
    done = builder.append_basic_block("rows.done")
    switch = builder.switch(count, done)
    for n in range(1, ROW_VECTORS + 1):
        block = builder.append_basic_block(f"rows.{n}")
        switch.add_case(count.type(n), block)
        builder.position_at_end(block)
        emit(n)
        builder.branch(done)
    builder.position_at_end(done)


@intrinsic
def accumulate_rows(typingctx, out, at, src, t0, indices, data, order, lo, hi, add, n_vectors):
    """``out.flat[at:][:n] = (out.flat[at:][:n] if add else 0) + sum over p in [lo, hi) of
    data[q] * src[indices[p], t0:][:n]``, ``q = order[p]`` (``p`` where ``order`` is ``None``),
    ``n = n_vectors * VECTOR_BYTES / itemsize``, ``n_vectors`` from 1 to :data:`ROW_VECTORS`
    (nothing is done for another count); the terms in ``p`` order, one fused multiply-add each.
    ``out`` and ``src``: C-contiguous, ``src`` 2-D."""
    _row_array("out", out)
    _row_array("src", src)
    direct = isinstance(order, types.NoneType)

    def codegen(context, builder, signature, args):
        out_v, at_v, src_v, t0_v, indices_v, data_v, order_v, lo_v, hi_v, add_v, count = args
        vector, width, fmuladd = _vectors(context, builder, src.dtype)
        itemsize = VECTOR_BYTES // width
        rows, stride = _rows_pointer(context, builder, src, src_v, t0_v)
        indices_ptr = _data(context, builder, indices, indices_v)
        data_ptr = _data(context, builder, data, data_v)
        order_ptr = None if direct else _data(context, builder, order, order_v)
        target = builder.gep(_data(context, builder, out, out_v), [at_v])
        zero = ir.Constant(vector, None)

        def emit(n_vectors: int) -> None:
            sums = [cgutils.alloca_once_value(builder, zero) for _ in range(n_vectors)]
            with builder.if_then(builder.icmp_unsigned("!=", add_v, add_v.type(0))):
                for k, slot in enumerate(sums):
                    builder.store(builder.load(_vector_at(builder, target, k * width, vector),
                                               align=itemsize), slot)
            with cgutils.for_range_slice(builder, lo_v, hi_v, _I64(1), inc=True) as (p, _):
                row = builder.gep(rows, [builder.mul(_index(builder, indices_ptr, p), stride)])
                q = p if direct else _index(builder, order_ptr, p)
                weight = _splat(builder, vector, builder.load(builder.gep(data_ptr, [q])))
                for k, slot in enumerate(sums):
                    part = builder.load(_vector_at(builder, row, k * width, vector),
                                        align=itemsize)
                    builder.store(builder.call(fmuladd, [weight, part, builder.load(slot)]),
                                  slot)
            for k, slot in enumerate(sums):
                builder.store(builder.load(slot), _vector_at(builder, target, k * width, vector),
                              align=itemsize)

        _by_vector_count(builder, count, emit)
        return context.get_dummy_value()

    signature = types.void(out, types.int64, src, types.int64, indices, data, order, types.int64,
                           types.int64, types.boolean, types.int64)
    return signature, codegen


@intrinsic
def dot_rows(typingctx, out, x, at, src, t0, indices, lo, hi, n_vectors):
    """``out[p] += x.flat[at:][:n] . src[indices[p], t0:][:n]`` for ``p`` in ``[lo, hi)``, ``n``
    as for :func:`accumulate_rows`: the ``x`` chunk stays in registers for the whole run, each
    product is summed in up to four chains of vectors, then across lanes."""
    _row_array("x", x)
    _row_array("src", src)

    def codegen(context, builder, signature, args):
        out_v, x_v, at_v, src_v, t0_v, indices_v, lo_v, hi_v, count = args
        vector, width, fmuladd = _vectors(context, builder, src.dtype)
        itemsize = VECTOR_BYTES // width
        rows, stride = _rows_pointer(context, builder, src, src_v, t0_v)
        first = builder.gep(_data(context, builder, x, x_v), [at_v])
        indices_ptr = _data(context, builder, indices, indices_v)
        out_ptr = _data(context, builder, out, out_v)

        def emit(n_vectors: int) -> None:
            held = [builder.load(_vector_at(builder, first, k * width, vector), align=itemsize)
                    for k in range(n_vectors)]
            chains = min(4, n_vectors)
            with cgutils.for_range_slice(builder, lo_v, hi_v, _I64(1), inc=True) as (p, _):
                row = builder.gep(rows, [builder.mul(_index(builder, indices_ptr, p), stride)])
                sums = [ir.Constant(vector, None)] * chains
                for k in range(n_vectors):
                    part = builder.load(_vector_at(builder, row, k * width, vector),
                                        align=itemsize)
                    sums[k % chains] = builder.call(fmuladd, [held[k], part, sums[k % chains]])
                total = sums[0]
                for other in sums[1:]:
                    total = builder.fadd(total, other)
                slot = builder.gep(out_ptr, [p])
                builder.store(builder.fadd(builder.load(slot), _horizontal_sum(builder, total)),
                              slot)

        _by_vector_count(builder, count, emit)
        return context.get_dummy_value()

    signature = types.void(out, x, types.int64, src, types.int64, indices, types.int64,
                           types.int64, types.int64)
    return signature, codegen
