"""The kernels vtrain.omp splits across torch's OpenMP threads, as C callbacks (numba cfuncs).

libgomp calls a callback with one pointer, so each call's arguments travel in an int64 block: addresses and sizes of
arrays, integers, and floats (their bits, in the block, and their address). Every thread of the team takes parts of
the pass, its own first (thread t's is part t) and then any other not yet taken (a flag a part, set by an atomic
addition), and runs the kernel of vtrain.fused, vtrain.fused_binary or vtrain.fused_optim on each, unchanged,
writing its results into the block's slots for that part. A part's candidates go into its own stretch of the
candidate buffers (a part of n values has at most n); `_gathered` then packs them to the front, part by part, so
they come out in the whole pass's order.

Thread t takes part t first as torch's own parallel loops give thread t the t-th share of a pass: each core then
reads the values it wrote in the op before from its own caches, and a thread that comes late finds its part taken by
one that finished early. Claimed in arrival order from one counter, as they were, the parts went to either thread:
at two threads GPT-2-tiny d_model 256's trainer step took 322 and 319 ms against 309 and 307 now, resnet-tiny width
32's 300 and 294 against 280 and 295 (docs/benchmarks.md, session 46).

Imported on the first pass that runs split (numba compiles or loads the callbacks then, not at every import
of vtrain).
"""

from __future__ import annotations

import ctypes
from typing import Any

import llvmlite.binding as llvm
import numpy as np
from numba import carray, cfunc, njit, types
from numba.extending import intrinsic

from vtrain import fused, fused_binary, fused_gelu, fused_norms, fused_optim, omp, prefilter
from vtrain.fused import NEAR_BLOCK

_SIGNATURE = types.void(types.CPointer(types.int64))
_HEAD = 2  # block[0]: where the parts' flags begin (the block's last block[1] values); block[1]: the number of parts

# The callbacks ask libgomp for their thread's number in the team by a symbol of ours: the compiled code in numba's
# cache names it, and the name is bound here, in every process, before the callbacks are compiled or loaded. Without
# libgomp (`run` then calls a callback on this thread alone), thread 0.
_THREAD_ZERO = ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 0)
llvm.add_symbol("vtrain_omp_thread", omp.thread_number() or ctypes.cast(_THREAD_ZERO, ctypes.c_void_p).value)
_thread = types.ExternalFunction("vtrain_omp_thread", types.int32())

# `launch` calls libgomp's GOMP_parallel the same way, by a symbol of ours; without libgomp, a stand-in that runs the
# callback on this thread alone.
_ALONE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint)(
    lambda kernel, data, threads, flags: ctypes.CFUNCTYPE(None, ctypes.c_void_p)(kernel)(data))
llvm.add_symbol("vtrain_gomp_parallel", omp.parallel_address() or ctypes.cast(_ALONE, ctypes.c_void_p).value)
_gomp_parallel = types.ExternalFunction("vtrain_gomp_parallel",
                                        types.void(types.voidptr, types.voidptr, types.uint32, types.uint32))


@intrinsic
def _pointer(typingctx, address, dtype):  # noqa: ANN001, ANN202 (numba's intrinsic protocol)
    """An array address (an int64 in a block) as a pointer to `dtype` values, for numba's `carray`."""
    if not isinstance(dtype, types.NumberClass):
        return None
    target = types.CPointer(dtype.instance_type)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.inttoptr(args[0], context.get_value_type(target))

    return target(types.int64, dtype), codegen


@intrinsic
def _void(typingctx, address):  # noqa: ANN001, ANN202
    """An address (an int64) as a C void pointer, for `_gomp_parallel`."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.inttoptr(args[0], context.get_value_type(types.voidptr))

    return types.voidptr(types.int64), codegen


@njit(cache=True, nogil=True)
def launch(kernel: int, block: np.ndarray, threads: int) -> None:
    """vtrain.omp.run's pass: the flags cleared, then the callback at address `kernel` on `threads` threads of
    torch's team, each given the block."""
    block[block[0]:] = 0
    _gomp_parallel(_void(kernel), _void(block.ctypes.data), threads, 0)


@intrinsic
def _take(typingctx, block, index):  # noqa: ANN001, ANN202
    """Whether this thread takes the part flagged at block[index]: the first to add 1 to it, atomically (each part
    goes to exactly one thread)."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        slot = builder.gep(args[0], [args[1]])
        old = builder.atomic_rmw("add", slot, context.get_constant(types.int64, 1), "monotonic")
        return builder.icmp_signed("==", old, context.get_constant(types.int64, 0))

    return types.boolean(block, index), codegen


@njit(cache=True, nogil=True, inline="always")
def _part(block: Any, j: int, parts: int) -> int:
    """The j-th part this thread tries (its own, thread t's part t, first, then the next ones round), or -1 where
    another thread has taken it (`_take`, of the part's flag past block[0])."""
    p = (_thread() + j) % parts
    return p if _take(block, block[0] + p) else -1


@njit(cache=True, nogil=True, inline="always")
def _cut(size: int, part: int, parts: int, grain: int) -> int:
    """Where part `part` of `parts` begins in a pass over `size` values, cut at a multiple of `grain`."""
    return min(size, (-(-size // grain) * part // parts) * grain)


def _as_floats(*values: float) -> tuple[float, ...]:
    """Values as Python floats: the compiled block builders take them as one tuple of one type."""
    return tuple(float(v) for v in values)


@njit(cache=True, nogil=True, inline="always")
def _new_block(parts: int, count: int, results: int) -> np.ndarray:
    """An argument block for `parts` parts, zeros: the head, `count` fields (the caller's to fill, as the callback
    reads them), `results` slots for each part (`_slot`), and a flag for each part (`_part`). Each wrapper below
    builds its block in one compiled call: in Python (a list of fields made an array, the arrays' addresses, a
    float64 array for the floats, the slots read back by numpy) a 262K-value product's call took ~10 us more, of
    ~60 at two threads, and a training step splits ~250 passes."""
    block = np.zeros(_HEAD + count + (results + 1) * parts, np.int64)
    block[0], block[1] = block.size - parts, parts
    return block


@njit(cache=True, nogil=True, inline="always")
def _put_floats(block: np.ndarray, field: int, values: Any) -> None:
    """Float fields kept in the block itself: block[field] holds the address of block[field + 1], and the fields from
    there hold the bits of the tuple `values` (a callback reads them as it reads a float64 array)."""
    block[field] = block.ctypes.data + 8 * (field + 1)
    floats = carray(_pointer(block[field], np.float64), len(values))
    for i in range(len(values)):
        floats[i] = values[i]


@njit(cache=True, nogil=True, inline="always")
def _slot(block: np.ndarray, results: int, p: int, column: int) -> int:
    """Part p's result slot `column` in a block that ran (`results` slots a part, just before the flags)."""
    return block[block[0] - results * block[1] + results * p + column]


@njit(cache=True, nogil=True)
def _slot_sum(block: np.ndarray, results: int, column: int) -> int:
    """The sum over the parts of their result slot `column`."""
    total = 0
    for p in range(block[1]):
        total += _slot(block, results, p, column)
    return total


@njit(cache=True, nogil=True)
def _slot_max(block: np.ndarray, results: int, column: int) -> int:
    """The largest of the parts' result slots `column`."""
    top = _slot(block, results, 0, column)
    for p in range(1, block[1]):
        top = max(top, _slot(block, results, p, column))
    return top


@njit(cache=True, nogil=True)
def _data(a: np.ndarray) -> int:
    """An array's data address, read by a compiled function (numpy's `a.ctypes.data` builds a ctypes object)."""
    return a.ctypes.data


def _require(dtype: type, *arrays: np.ndarray | None) -> None:
    """The callbacks read every array as C-contiguous values of its one dtype, by address: anything else would be
    misread (the compiled single passes would take it, each in a version of its own)."""
    for a in arrays:
        if a is not None and (a.dtype != dtype or not a.flags.c_contiguous):
            raise TypeError(f"vtrain.omp_kernels takes C-contiguous {np.dtype(dtype)} arrays, got {a.dtype}, "
                            f"strides {a.strides}")


@njit(cache=True, nogil=True)
def _gathered(block: np.ndarray, units: int, grain: int, per_unit: int, cand: np.ndarray,
              held: np.ndarray, e_cand: np.ndarray | None = None) -> tuple[int, int]:
    """(count, first bad position or -1) of the whole pass from the parts' slots (count, bad), part p having begun
    at `_cut`(units, p, parts, grain) * per_unit: the parts' candidates moved from cand[start:start + count]
    (positions counted from start) and held's alongside to the front, in order (and e_cand's, where given)."""
    total, bad = 0, -1
    for p in range(block[1]):
        found, first_bad = _slot(block, 2, p, 0), _slot(block, 2, p, 1)
        start = _cut(units, p, block[1], grain) * per_unit
        for i in range(found):  # (forward: a stretch moves down, to where the ones before it ended)
            cand[total + i] = cand[start + i] + start
            held[total + i] = held[start + i]
            if e_cand is not None:
                e_cand[total + i] = e_cand[start + i]
        total += found
        if bad < 0 <= first_bad:
            bad = start + first_bad
    return total, bad


# fused_binary.binary: fields code, a (address, size), sa[4], b (address, size), sb[4], dims[4], out (address, 0:
# in place), m, cast32, floats (the address of the next field), limit (float64 bits), size; one slot a part: its
# count of values off the grid.
_B_FIELDS = 23


@cfunc(_SIGNATURE, cache=True, error_model="numpy")
def _binary_part(d):  # noqa: ANN001, ANN202
    blk = carray(d, _HEAD + _B_FIELDS + d[1])
    code, m, cast32, size, parts = blk[2], blk[20], blk[21] != 0, blk[24], blk[1]
    a, b = carray(_pointer(blk[3], np.float64), blk[4]), carray(_pointer(blk[9], np.float64), blk[10])
    sa, sb, dims = blk[5:9], blk[11:15], blk[15:19]
    limit = carray(_pointer(blk[22], np.float64), 1)[0]
    for j in range(parts):
        p = _part(d, j, parts)
        if p < 0:
            continue
        lo, hi = _cut(size, p, parts, 1), _cut(size, p + 1, parts, 1)
        if blk[19] == 0:
            nbad = fused_binary._binary(code, a, sa, b, sb, dims, None, m, cast32, limit, lo, hi)
        else:
            out = carray(_pointer(blk[19], np.float64), size)
            nbad = fused_binary._binary(code, a, sa, b, sb, dims, out, m, cast32, limit, lo, hi)
        blk[_HEAD + _B_FIELDS + p] = nbad


@njit(cache=True, nogil=True)
def _binary_block(parts: int, code: int, a: np.ndarray, sa: np.ndarray, b: np.ndarray, sb: np.ndarray,
                  dims: np.ndarray, out: np.ndarray | None, m: int, cast32: bool, limit: float,
                  size: int) -> np.ndarray:
    block = _new_block(parts, _B_FIELDS, 1)
    block[2], block[3], block[4] = code, a.ctypes.data, a.size
    block[5:9] = sa
    block[9], block[10] = b.ctypes.data, b.size
    block[11:15] = sb
    block[15:19] = dims
    block[19] = 0 if out is None else out.ctypes.data
    block[20], block[21], block[24] = m, cast32, size
    _put_floats(block, 22, (limit,))
    return block


def binary(parts: int, code: int, a: np.ndarray, sa: np.ndarray, b: np.ndarray, sb: np.ndarray, dims: np.ndarray,
           out: np.ndarray | None, m: int, cast32: bool, limit: float, size: int) -> int:
    """`fused_binary._binary` over all `size` output values, in `parts` parts: the count of values off the grid."""
    _require(np.float64, a, b, out)
    _require(np.int64, sa, sb, dims)
    block = _binary_block(parts, code, a, sa, b, sb, dims, out, m, cast32, float(limit), size)
    omp.run(_binary_part.address, block, parts)
    return _slot_sum(block, 1, 0)


# fused_gelu._pass and fused_norms._pass (the model families' fused elementwise chains, fused.run_chain): fields kind
# (fused.CHAIN_GELU or CHAIN_NORM), code, a, b, c, e, o, q (address and size each: four inputs and two outputs, as many
# as the pass uses), rows, width (1 for the GELU, whose passes go value by value), period, count (a norm's statistics:
# row r's are number r % period, over `count` values), floats (the address of the next field), limit (float64 bits);
# one slot a part: its count of values off the grid. Parts are whole rows.
_E_FIELDS = 20


@cfunc(_SIGNATURE, cache=True, error_model="numpy")
def _chain_part(d):  # noqa: ANN001, ANN202
    blk = carray(d, _HEAD + _E_FIELDS + d[1])
    kind, code, rows, width, period, count, parts = blk[2], blk[3], blk[16], blk[17], blk[18], blk[19], blk[1]
    a, b = carray(_pointer(blk[4], np.float64), blk[5]), carray(_pointer(blk[6], np.float64), blk[7])
    c, e = carray(_pointer(blk[8], np.float64), blk[9]), carray(_pointer(blk[10], np.float64), blk[11])
    o, q = carray(_pointer(blk[12], np.float64), blk[13]), carray(_pointer(blk[14], np.float64), blk[15])
    limit = carray(_pointer(blk[20], np.float64), 1)[0]
    for j in range(parts):
        p = _part(d, j, parts)
        if p < 0:
            continue
        r0, r1 = _cut(rows, p, parts, 1), _cut(rows, p + 1, parts, 1)
        if kind == fused.CHAIN_GELU:
            bad = fused_gelu._pass(code, a, b, c, e, o, q, r0, r1, width, period, count, limit)
        else:
            bad = fused_norms._pass(code, a, b, c, e, o, q, r0, r1, width, period, count, limit)
        blk[_HEAD + _E_FIELDS + p] = bad


@njit(cache=True, nogil=True)
def _chain_block(parts: int, kind: int, code: int, a: np.ndarray, b: np.ndarray, c: np.ndarray, e: np.ndarray,
                 o: np.ndarray, q: np.ndarray, rows: int, width: int, period: int, count: int,
                 limit: float) -> np.ndarray:
    block = _new_block(parts, _E_FIELDS, 1)
    block[2], block[3] = kind, code
    block[4], block[5], block[6], block[7] = a.ctypes.data, a.size, b.ctypes.data, b.size
    block[8], block[9], block[10], block[11] = c.ctypes.data, c.size, e.ctypes.data, e.size
    block[12], block[13], block[14], block[15] = o.ctypes.data, o.size, q.ctypes.data, q.size
    block[16], block[17], block[18], block[19] = rows, width, period, count
    _put_floats(block, 20, (limit,))
    return block


def chain(kind: int, parts: int, code: int, a: np.ndarray, b: np.ndarray, c: np.ndarray, e: np.ndarray, o: np.ndarray,
          q: np.ndarray, rows: int, width: int, period: int, count: int, limit: float) -> int:
    """Pass `code` of `fused_gelu` (kind fused.CHAIN_GELU: rows the values, width 1) or `fused_norms` (CHAIN_NORM:
    `rows` rows of `width` values, row r's statistics number r % period over `count` values) over all its rows in
    `parts` parts: the count of values off the grid."""
    _require(np.float64, a, b, c, e, o, q)
    block = _chain_block(parts, kind, code, a, b, c, e, o, q, rows, width, period, count, float(limit))
    omp.run(_chain_part.address, block, parts)
    return _slot_sum(block, 1, 0)


# fused.round_near (bits = 32) and round_near_relative: fields v, out, cand, held (addresses), size, e (address,
# size; size 0: the relative band), floats (the address of the next seven fields: factor, limit, plus, k, a, c, f,
# as `_put_floats` keeps them); two slots a part: count, bad.
_N_FIELDS = 15


@cfunc(_SIGNATURE, cache=True, error_model="numpy")
def _near_part(d):  # noqa: ANN001, ANN202
    blk = carray(d, _HEAD + _N_FIELDS + 2 * d[1])
    size, parts, e_size = blk[6], blk[1], blk[8]
    floats = carray(_pointer(blk[9], np.float64), 7)
    factor, limit, plus, k, a, c, f = floats[0], floats[1], floats[2], floats[3], floats[4], floats[5], floats[6]
    for j in range(parts):
        p = _part(d, j, parts)
        if p < 0:
            continue
        lo, hi = _cut(size, p, parts, NEAR_BLOCK), _cut(size, p + 1, parts, NEAR_BLOCK)
        v = carray(_pointer(blk[2] + 8 * lo, np.float64), hi - lo)
        out = carray(_pointer(blk[3] + 8 * lo, np.float64), hi - lo)
        cand = carray(_pointer(blk[4] + 8 * lo, np.int64), hi - lo)
        held = carray(_pointer(blk[5] + 8 * lo, np.float64), hi - lo)
        if e_size == 0:
            count, bad = fused._round_near32_relative(v, k, a, c, f, factor, limit, out, cand, held, plus)
        else:
            e = carray(_pointer(blk[7] + 8 * lo * (e_size > 1), np.float64), hi - lo if e_size > 1 else 1)
            count, bad = fused._round_near32(v, e, factor, limit, out, cand, held, plus)
        at = _HEAD + _N_FIELDS + 2 * p
        blk[at], blk[at + 1] = count, bad


@njit(cache=True, nogil=True)
def _near_block(parts: int, v: np.ndarray, e: np.ndarray | None, out: np.ndarray, cand: np.ndarray,
                held: np.ndarray, floats: tuple) -> np.ndarray:
    block = _new_block(parts, _N_FIELDS, 2)
    block[2], block[3], block[4], block[5], block[6] = v.ctypes.data, out.ctypes.data, cand.ctypes.data, \
        held.ctypes.data, v.size
    if e is not None:
        block[7], block[8] = e.ctypes.data, e.size
    _put_floats(block, 9, floats)
    return block


def round_near32(parts: int, v: np.ndarray, e: np.ndarray | None, out: np.ndarray, cand: np.ndarray,
                 held: np.ndarray, factor: float, limit: float, plus: float,
                 relative: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)) -> tuple[int, int]:
    """`fused._round_near32` (band e) or, e None, `fused._round_near32_relative` (its terms `relative`) over v
    in `parts` parts: (count, first bad position or -1), cand[:count] and held[:count] as the whole pass's."""
    _require(np.float64, v, e, out, held)
    _require(np.int64, cand)
    block = _near_block(parts, v, e, out, cand, held, _as_floats(factor, limit, plus, *relative))
    omp.run(_near_part.address, block, parts)
    return _gathered(block, v.size, NEAR_BLOCK, 1, cand, held)


# fused.round_near_outer: fields v, out, cand, held (addresses), batches, rows a batch, columns, rows, cols, add,
# sa, sb (addresses; sa 0: no support), words a bitset, floats (the address of the next three fields: factor,
# limit, plus); two slots a part. Parts are whole rows of the one batch, or whole batches.
_O_FIELDS = 17


@cfunc(_SIGNATURE, cache=True, error_model="numpy")
def _outer_part(d):  # noqa: ANN001, ANN202
    blk = carray(d, _HEAD + _O_FIELDS + 2 * d[1])
    parts, batches, m, n, words = blk[1], blk[6], blk[7], blk[8], blk[14]
    floats = carray(_pointer(blk[15], np.float64), 3)
    size = m if batches == 1 else batches  # (the units the parts are cut in)
    for j in range(parts):
        p = _part(d, j, parts)
        if p < 0:
            continue
        lo, hi = _cut(size, p, parts, 1), _cut(size, p + 1, parts, 1)
        # rows r0:r1 of the one batch, or batches lo:hi: (batches of the part, rows a batch, first batch, first row)
        nb, nm, b0, r0 = (1, hi - lo, 0, lo) if batches == 1 else (hi - lo, m, lo, 0)
        start = (b0 * m + r0) * n
        v = carray(_pointer(blk[2] + 8 * start, np.float64), nb * nm * n)
        out = carray(_pointer(blk[3] + 8 * start, np.float64), nb * nm * n)
        cand = carray(_pointer(blk[4] + 8 * start, np.int64), nb * nm * n)
        held = carray(_pointer(blk[5] + 8 * start, np.float64), nb * nm * n)
        rows = carray(_pointer(blk[9] + 8 * (b0 * m + r0), np.float64), (nb, nm))
        cols = carray(_pointer(blk[10] + 8 * b0 * n, np.float64), (nb, n))
        add = carray(_pointer(blk[11] + 8 * b0 * n, np.float64), (nb, n))
        if words:
            sa = carray(_pointer(blk[12] + 8 * (b0 * m + r0) * words, np.uint64), (nb, nm, words))
            sb = carray(_pointer(blk[13] + 8 * b0 * n * words, np.uint64), (nb, n, words))
        else:
            sa = sb = np.zeros((0, 0, 0), np.uint64)
        count, bad = fused._round_near32_outer(v, rows, cols, add, floats[0], floats[1], out, cand, held, floats[2],
                                               sa, sb)
        at = _HEAD + _O_FIELDS + 2 * p
        blk[at], blk[at + 1] = count, bad


@njit(cache=True, nogil=True)
def _outer_block(parts: int, v: np.ndarray, rows: np.ndarray, cols: np.ndarray, add: np.ndarray, out: np.ndarray,
                 cand: np.ndarray, held: np.ndarray, sa: np.ndarray, sb: np.ndarray, floats: tuple) -> np.ndarray:
    block = _new_block(parts, _O_FIELDS, 2)
    block[2], block[3], block[4], block[5] = v.ctypes.data, out.ctypes.data, cand.ctypes.data, held.ctypes.data
    block[6], block[7], block[8] = rows.shape[0], rows.shape[1], cols.shape[1]
    block[9], block[10], block[11] = rows.ctypes.data, cols.ctypes.data, add.ctypes.data
    if sa.size:
        block[12], block[13], block[14] = sa.ctypes.data, sb.ctypes.data, sa.shape[2]
    _put_floats(block, 15, floats)
    return block


def round_near32_outer(parts: int, v: np.ndarray, rows: np.ndarray, cols: np.ndarray, add: np.ndarray,
                       factor: float, limit: float, out: np.ndarray, cand: np.ndarray, held: np.ndarray, plus: float,
                       sa: np.ndarray, sb: np.ndarray) -> tuple[int, int]:
    """`fused._round_near32_outer` in up to `parts` parts of whole rows (one batch) or whole batches: as
    `round_near32`. The arrays must be C-contiguous (rows (B, M), cols and add (B, N), sa (B, M, W) and sb
    (B, N, W) or both empty)."""
    _require(np.float64, v, rows, cols, add, out, held)
    _require(np.int64, cand)
    _require(np.uint64, sa, sb)
    batches, m, n = rows.shape[0], rows.shape[1], cols.shape[1]
    units = m if batches == 1 else batches
    parts = min(parts, units)
    block = _outer_block(parts, v, rows, cols, add, out, cand, held, sa, sb, _as_floats(factor, limit, plus))
    omp.run(_outer_part.address, block, parts)
    return _gathered(block, units, 1, n if batches == 1 else m * n, cand, held)


# fused.round_near_softmax and round_near_softmax_backward: fields kind (ROWS_SOFTMAX, ROWS_LOG_SOFTMAX or
# ROWS_BACKWARD), a (x, or grad), b (0, or p), v, out, cand, held, e_cand (addresses), rows, n, floats (the address of
# the next eight fields: factor, limit, plus, u, t, g, c, floor); two slots a part: count, bad. Parts are whole rows.
_ROW_FIELDS = 19
ROWS_SOFTMAX, ROWS_LOG_SOFTMAX, ROWS_BACKWARD = 0, 1, 2


@cfunc(_SIGNATURE, cache=True, error_model="numpy")
def _rows_part(d):  # noqa: ANN001, ANN202
    blk = carray(d, _HEAD + _ROW_FIELDS + 2 * d[1])
    parts, kind, rows, n = blk[1], blk[2], blk[10], blk[11]
    fl = carray(_pointer(blk[12], np.float64), 8)
    factor, limit, plus, u, t, g, c, floor = fl[0], fl[1], fl[2], fl[3], fl[4], fl[5], fl[6], fl[7]
    for j in range(parts):
        p = _part(d, j, parts)
        if p < 0:
            continue
        lo, hi = _cut(rows, p, parts, 1), _cut(rows, p + 1, parts, 1)
        start, size = lo * n, (hi - lo) * n
        a = carray(_pointer(blk[3] + 8 * start, np.float64), (hi - lo, n))
        v = carray(_pointer(blk[5] + 8 * start, np.float64), size)
        out = carray(_pointer(blk[6] + 8 * start, np.float64), size)
        cand = carray(_pointer(blk[7] + 8 * start, np.int64), size)
        held = carray(_pointer(blk[8] + 8 * start, np.float64), size)
        e_cand = carray(_pointer(blk[9] + 8 * start, np.float64), size)
        if kind == ROWS_BACKWARD:
            b = carray(_pointer(blk[4] + 8 * start, np.float64), (hi - lo, n))
            count, bad = fused._round_near_softmax_backward(a, b, u, g, c, floor, v, factor, limit, out, cand, held,
                                                            e_cand, plus)
        else:
            count, bad = fused._round_near_softmax(a, kind == ROWS_LOG_SOFTMAX, u, t, g, c, floor, v, factor, limit,
                                                   out, cand, held, e_cand, plus)
        at = _HEAD + _ROW_FIELDS + 2 * p
        blk[at], blk[at + 1] = count, bad


@njit(cache=True, nogil=True)
def _rows_block(parts: int, kind: int, a: np.ndarray, b: np.ndarray | None, v: np.ndarray, out: np.ndarray,
                cand: np.ndarray, held: np.ndarray, e_cand: np.ndarray, floats: tuple) -> np.ndarray:
    block = _new_block(parts, _ROW_FIELDS, 2)
    block[2], block[3], block[5], block[6] = kind, a.ctypes.data, v.ctypes.data, out.ctypes.data
    if b is not None:
        block[4] = b.ctypes.data
    block[7], block[8], block[9], block[10], block[11] = cand.ctypes.data, held.ctypes.data, e_cand.ctypes.data, \
        a.shape[0], a.shape[1]
    _put_floats(block, 12, floats)
    return block


def round_near_rows(kind: int, parts: int, a: np.ndarray, b: np.ndarray | None, v: np.ndarray, out: np.ndarray,
                    cand: np.ndarray, held: np.ndarray, e_cand: np.ndarray,
                    floats: tuple[float, ...]) -> tuple[int, int]:
    """`fused._round_near_softmax` (kind ROWS_SOFTMAX, ROWS_LOG_SOFTMAX; a = x) or
    `fused._round_near_softmax_backward` (ROWS_BACKWARD; a = grad, b = p) over a's rows, (rows, n), in up to `parts`
    parts of whole rows: as `round_near32`, e_cand[:count] the whole pass's too. floats: (factor, limit, plus, u, t,
    g, c, floor)."""
    _require(np.float64, a, b, v, out, held, e_cand)
    _require(np.int64, cand)
    rows, n = a.shape
    parts = min(parts, rows)
    block = _rows_block(parts, kind, a, b, v, out, cand, held, e_cand, _as_floats(*floats))
    omp.run(_rows_part.address, block, parts)
    return _gathered(block, rows, 1, n, cand, held, e_cand)


# fused.round_in_place and round_into (float64 values): fields v, out (0: in place), size, m, cast32, floats (the
# address of the next field: limit); one slot a part: its first position off the grid, or -1.
_R_FIELDS = 7


@cfunc(_SIGNATURE, cache=True, error_model="numpy")
def _round_part(d):  # noqa: ANN001, ANN202
    blk = carray(d, _HEAD + _R_FIELDS + d[1])
    parts, size, m, cast32 = blk[1], blk[4], blk[5], blk[6] != 0
    limit = carray(_pointer(blk[7], np.float64), 1)[0]
    for j in range(parts):
        p = _part(d, j, parts)
        if p < 0:
            continue
        lo, hi = _cut(size, p, parts, NEAR_BLOCK), _cut(size, p + 1, parts, NEAR_BLOCK)
        v = carray(_pointer(blk[2] + 8 * lo, np.float64), hi - lo)
        if blk[3] == 0:
            bad = fused._round_in_place(v, m, cast32, limit)
        else:
            out = carray(_pointer(blk[3] + 8 * lo, np.float64), hi - lo)
            bad = fused._round_into(v, v.view(np.int64), 52, 0x7FF, 1023, out, m, cast32, limit)
        blk[_HEAD + _R_FIELDS + p] = bad


@njit(cache=True, nogil=True)
def _round_block(parts: int, v: np.ndarray, out: np.ndarray | None, m: int, limit: float) -> np.ndarray:
    block = _new_block(parts, _R_FIELDS, 1)
    block[2], block[4], block[5], block[6] = v.ctypes.data, v.size, m, m == 23
    if out is not None:
        block[3] = out.ctypes.data
    _put_floats(block, 7, (limit,))
    return block


@njit(cache=True, nogil=True)
def _first_bad(block: np.ndarray, size: int) -> int:
    """The first position off the grid over the parts' slots (each counted from its part's start), or -1."""
    for p in range(block[1]):
        bad = _slot(block, 1, p, 0)
        if bad >= 0:
            return _cut(size, p, block[1], NEAR_BLOCK) + bad
    return -1


def round_float64(parts: int, v: np.ndarray, out: np.ndarray | None, m: int, limit: float) -> int:
    """`fused._round_in_place` (out None) or `fused._round_into` over float64 v in `parts` parts: the first
    position whose rounding is off the grid, or -1."""
    _require(np.float64, v, out)
    block = _round_block(parts, v, out, m, float(limit))
    omp.run(_round_part.address, block, parts)
    return _first_bad(block, v.size)


# fused.sums_with_abs's lines (float64): fields x (address), its shape (3 values), total, out (addresses), floats
# (the address of the next field: divisor). Parts are whole kept elements; no slots.
_S_FIELDS = 8


@cfunc(_SIGNATURE, cache=True, error_model="numpy")
def _lanes_part(d):  # noqa: ANN001, ANN202
    blk = carray(d, _HEAD + _S_FIELDS)
    parts, kept = blk[1], blk[4]
    x = carray(_pointer(blk[2], np.float64), (blk[3], kept, blk[5]))
    total, out = carray(_pointer(blk[6], np.float64), kept), carray(_pointer(blk[7], np.float64), kept)
    divisor = carray(_pointer(blk[8], np.float64), 1)[0]
    for j in range(parts):
        p = _part(d, j, parts)
        if p < 0:
            continue
        fused._lane_sums_with_abs(x, total, out, divisor, _cut(kept, p, parts, 1), _cut(kept, p + 1, parts, 1))


@njit(cache=True, nogil=True)
def _lanes_block(parts: int, lines: np.ndarray, total: np.ndarray, out: np.ndarray, divisor: float) -> np.ndarray:
    block = _new_block(parts, _S_FIELDS, 0)
    block[2], block[3], block[4], block[5] = lines.ctypes.data, lines.shape[0], lines.shape[1], lines.shape[2]
    block[6], block[7] = total.ctypes.data, out.ctypes.data
    _put_floats(block, 8, (divisor,))
    return block


def lane_sums_with_abs(parts: int, lines: np.ndarray, total: np.ndarray, out: np.ndarray, divisor: float) -> None:
    """`fused._lane_sums_with_abs` over C-contiguous float64 lines (outer, kept, inner) into total and out, in
    `parts` parts of whole kept elements (each element's sums in the one pass's order)."""
    _require(np.float64, lines, total, out)
    omp.run(_lanes_part.address, _lanes_block(parts, lines, total, out, float(divisor)), parts)


# fused_optim._adam or _sgd over a group's float64 parameters as one pass: fields kind (0 Adam, 1 SGD), tensors
# (address of an int64 table, a row a parameter: the arrays' addresses (Adam: p, g, m1, m2; SGD: p, g, buf, 0),
# size, first position in the pass), their count, coefficients (address of a float64 table, a row a parameter:
# Adam's decay, wd, w1, beta2, w2, bc2_sqrt, eps, scale; SGD's fresh, wd, momentum, alpha, neg_lr, 0, 0, 0), m,
# values in all, floats (the address of the next field: limit); two slots a part: the first parameter whose update
# failed a check (or the count: none), its flags.
_U_FIELDS = 8
ADAM, SGD = 0, 1


@cfunc(_SIGNATURE, cache=True, error_model="numpy")
def _update_part(d):  # noqa: ANN001, ANN202
    blk = carray(d, _HEAD + _U_FIELDS + 2 * d[1])
    parts, kind, count, m, size = blk[1], blk[2], blk[4], blk[6], blk[7]
    table = carray(_pointer(blk[3], np.int64), (count, 6))
    coef = carray(_pointer(blk[5], np.float64), (count, 8))
    limit = carray(_pointer(blk[8], np.float64), 1)[0]
    for j in range(parts):
        p = _part(d, j, parts)
        if p < 0:
            continue
        lo, hi = _cut(size, p, parts, NEAR_BLOCK), _cut(size, p + 1, parts, NEAR_BLOCK)
        first, flags = count, 0
        for t in range(count):
            n, start = table[t, 4], table[t, 5]
            a, b = max(lo, start) - start, min(hi, start + n) - start
            if a >= b:
                continue
            x, g = carray(_pointer(table[t, 0], np.float64), n), carray(_pointer(table[t, 1], np.float64), n)
            s1, c = carray(_pointer(table[t, 2], np.float64), n), coef[t]
            if kind == ADAM:
                s2 = carray(_pointer(table[t, 3], np.float64), n)
                bad = fused_optim._adam(x, g, s1, s2, c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], m, m == 23,
                                        limit, a, b)
            else:
                bad = fused_optim._sgd(x, g, s1, c[0] != 0, c[1], c[2], c[3], c[4], m, m == 23, limit, a, b)
            if bad and first == count:
                first, flags = t, bad
        at = _HEAD + _U_FIELDS + 2 * p
        blk[at], blk[at + 1] = first, flags


@njit(cache=True, nogil=True)
def _update_block(parts: int, kind: int, table: np.ndarray, coef: np.ndarray, m: int, size: int,
                  limit: float) -> np.ndarray:
    block = _new_block(parts, _U_FIELDS, 2)
    block[2], block[3], block[4], block[5] = kind, table.ctypes.data, table.shape[0], coef.ctypes.data
    block[6], block[7] = m, size
    _put_floats(block, 8, (limit,))
    return block


@njit(cache=True, nogil=True)
def _update_answer(block: np.ndarray, count: int) -> tuple[int, int]:
    """(the first parameter whose update failed a check over the parts' slots, or -1; its flags from every part)."""
    first, flags = count, 0
    for p in range(block[1]):
        first = min(first, _slot(block, 2, p, 0))
    for p in range(block[1]):
        if _slot(block, 2, p, 0) == first:
            flags |= _slot(block, 2, p, 1)
    return (-1, 0) if first == count else (first, flags)


def update(kind: int, parts: int, arrays: list[list[np.ndarray]], coefficients: list[tuple], m: int,
           limit: float) -> tuple[int, int]:
    """`fused_optim._adam` (kind ADAM) or `_sgd` (SGD), float64 work, on every parameter's arrays in `arrays`
    ((p, g, m1, m2) or (p, g, buf)), with its coefficients (the kernel's, in its order), as one pass over all
    their values in `parts` parts: (the first parameter whose update failed a check, or -1; its flags)."""
    table, start = np.zeros((len(arrays), 6), np.int64), 0
    for row, group in zip(table, arrays):
        _require(np.float64, *group)
        row[:len(group)] = [_data(a) for a in group]
        row[4:] = group[0].size, start
        start += group[0].size
    coef = np.zeros((len(arrays), 8), np.float64)
    for row, c in zip(coef, coefficients):
        row[:len(c)] = c
    block = _update_block(parts, kind, table, coef, m, start, float(limit))
    omp.run(_update_part.address, block, parts)
    return _update_answer(block, len(arrays))


# prefilter._norms_both (float64): fields x, its rows and columns, the rows' norms, the blocks' column squares sq
# (blocks x columns) and the parts' column zeros zc (parts x columns) (addresses but for the sizes); two slots a part:
# its values below prefilter._TINY_LINE and most zeros in a row. Parts are whole row blocks.
_M_FIELDS = 6


@cfunc(_SIGNATURE, cache=True, error_model="numpy")
def _norms_part(d):  # noqa: ANN001, ANN202
    blk = carray(d, _HEAD + _M_FIELDS + 2 * d[1])
    parts, n, width = blk[1], blk[3], blk[4]
    blocks = prefilter.norm_blocks(n)
    x = carray(_pointer(blk[2], np.float64), (n, width))
    rows = carray(_pointer(blk[5], np.float64), n)
    sq = carray(_pointer(blk[6], np.float64), (blocks, width))
    zc = carray(_pointer(blk[7], np.int64), (parts, width))
    for j in range(parts):
        p = _part(d, j, parts)
        if p < 0:
            continue
        at = _HEAD + _M_FIELDS + 2 * p
        blk[at], blk[at + 1] = prefilter.norms_of_blocks(x, rows, sq, zc[p], _cut(blocks, p, parts, 1),
                                                         _cut(blocks, p + 1, parts, 1))


@njit(cache=True, nogil=True)
def _norms_block(parts: int, x: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`norms`' block, with the blocks' column squares and the parts' column zeros it names."""
    n, width = x.shape
    sq, zc = np.zeros((prefilter.norm_blocks(n), width)), np.zeros((parts, width), np.int64)
    block = _new_block(parts, _M_FIELDS, 2)
    block[2], block[3], block[4], block[5] = x.ctypes.data, n, width, rows.ctypes.data
    block[6], block[7] = sq.ctypes.data, zc.ctypes.data
    return block, sq, zc


@njit(cache=True, nogil=True)
def _norms_answer(block: np.ndarray, sq: np.ndarray, zc: np.ndarray, rows: np.ndarray,
                  cols: np.ndarray) -> tuple[bool, int, int, int]:
    return prefilter.norms_finish(sq, zc.sum(axis=0), rows, cols, _slot_sum(block, 2, 0), _slot_max(block, 2, 1))


def norms(parts: int, x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> tuple[bool, int, int, int]:
    """`prefilter._norms_both` over a C-contiguous float64 x in `parts` parts of whole row blocks (at most as many
    as it has): its answer, and the norms, bit for bit (each block's column squares summed apart, then in order)."""
    _require(np.float64, x, rows, cols)
    block, sq, zc = _norms_block(parts, x, rows)
    omp.run(_norms_part.address, block, parts)
    return _norms_answer(block, sq, zc, rows, cols)


# prefilter._norms_batched (float64): fields x, its batches, rows a batch, columns, the rows' and the columns' norms
# (addresses but for the sizes); four slots a part: its answer. Parts are whole batches.
_BN_FIELDS = 6


@cfunc(_SIGNATURE, cache=True, error_model="numpy")
def _norms_batched_part(d):  # noqa: ANN001, ANN202
    blk = carray(d, _HEAD + _BN_FIELDS + 4 * d[1])
    parts, batches, m, k = blk[1], blk[3], blk[4], blk[5]
    x = carray(_pointer(blk[2], np.float64), (batches, m, k))
    rows, cols = carray(_pointer(blk[6], np.float64), (batches, m)), carray(_pointer(blk[7], np.float64), (batches, k))
    for j in range(parts):
        p = _part(d, j, parts)
        if p < 0:
            continue
        lo, hi = _cut(batches, p, parts, 1), _cut(batches, p + 1, parts, 1)
        finite, tiny, row_zeros, col_zeros = prefilter._norms_batched(x[lo:hi], rows[lo:hi], cols[lo:hi])
        at = _HEAD + _BN_FIELDS + 4 * p
        blk[at], blk[at + 1], blk[at + 2], blk[at + 3] = finite, tiny, row_zeros, col_zeros


@njit(cache=True, nogil=True)
def _batched_block(parts: int, x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    block = _new_block(parts, _BN_FIELDS, 4)
    block[2], block[3], block[4], block[5] = x.ctypes.data, x.shape[0], x.shape[1], x.shape[2]
    block[6], block[7] = rows.ctypes.data, cols.ctypes.data
    return block


@njit(cache=True, nogil=True)
def _batched_answer(block: np.ndarray) -> tuple[bool, int, int, int]:
    finite = True
    for p in range(block[1]):
        finite &= _slot(block, 4, p, 0) != 0
    return finite, _slot_sum(block, 4, 1), _slot_max(block, 4, 2), _slot_max(block, 4, 3)


def norms_batched(parts: int, x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> tuple[bool, int, int, int]:
    """`prefilter._norms_batched` over a C-contiguous float64 (B, M, K) x in `parts` parts of whole batches (at most
    B): its answer, and the norms, bit for bit."""
    _require(np.float64, x, rows, cols)
    block = _batched_block(parts, x, rows, cols)
    omp.run(_norms_batched_part.address, block, parts)
    return _batched_answer(block)


# prefilter._row_dots (float64): fields g (address, rows, length), taps (address, rows), co_g, out (address,
# columns). Parts are runs of out's columns; no slots.
_D_FIELDS = 8


@cfunc(_SIGNATURE, cache=True, error_model="numpy")
def _dots_part(d):  # noqa: ANN001, ANN202
    blk = carray(d, _HEAD + _D_FIELDS)
    parts, length, width = blk[1], blk[4], blk[9]
    g = carray(_pointer(blk[2], np.float64), (blk[3], length))
    taps = carray(_pointer(blk[5], np.float64), (blk[6], length))
    out = carray(_pointer(blk[8], np.float64), (blk[3], width))
    for j in range(parts):
        p = _part(d, j, parts)
        if p >= 0:
            prefilter._row_dots(g, taps, blk[7], _cut(width, p, parts, 1), _cut(width, p + 1, parts, 1), out)


@njit(cache=True, nogil=True)
def _dots_block(parts: int, g: np.ndarray, taps: np.ndarray, co_g: int, out: np.ndarray) -> np.ndarray:
    block = _new_block(parts, _D_FIELDS, 0)
    block[2], block[3], block[4] = g.ctypes.data, g.shape[0], g.shape[1]
    block[5], block[6], block[7] = taps.ctypes.data, taps.shape[0], co_g
    block[8], block[9] = out.ctypes.data, out.shape[1]
    return block


def row_dots(parts: int, g: np.ndarray, taps: np.ndarray, co_g: int, out: np.ndarray) -> None:
    """`prefilter._row_dots` over all of out's columns in `parts` parts of whole columns: the one pass's bits."""
    _require(np.float64, g, taps, out)
    if parts < 1 or co_g < 1 or g.shape[1] != taps.shape[1] or out.shape[0] != g.shape[0] or g.shape[0] % co_g or \
            taps.shape[0] != g.shape[0] // co_g * out.shape[1]:  # (the callback reads by address, unchecked)
        raise ValueError(f"row_dots: g {g.shape}, taps {taps.shape}, groups of {co_g}, out {out.shape}")
    omp.run(_dots_part.address, _dots_block(parts, g, taps, co_g, out), parts)


# prefilter's E at a convolution's candidates (float64): fields kind (CONV_FORWARD, CONV_INPUT, CONV_WEIGHT), the
# kernel's two operands (address and four dims each), the bias (address, size), pos (address, size), geometry
# (address, size), groups, the gradient's shape (address of four values), out (address). Parts are runs of
# positions, each position's E summed by one thread in the whole pass's order; no slots.
_C_FIELDS = 20


@cfunc(_SIGNATURE, cache=True, error_model="numpy")
def _conv_abs_part(d):  # noqa: ANN001, ANN202
    blk = carray(d, _HEAD + _C_FIELDS)
    parts, kind, size = blk[1], blk[2], blk[16]
    a = carray(_pointer(blk[3], np.float64), (blk[4], blk[5], blk[6], blk[7]))
    b = carray(_pointer(blk[8], np.float64), (blk[9], blk[10], blk[11], blk[12]))
    bias, pos = carray(_pointer(blk[13], np.float64), blk[14]), carray(_pointer(blk[15], np.int64), size)
    geometry, groups = carray(_pointer(blk[17], np.int64), blk[18]), blk[19]
    shape, out = carray(_pointer(blk[20], np.int64), 4), carray(_pointer(blk[21], np.float64), size)
    for j in range(parts):
        p = _part(d, j, parts)
        if p < 0:
            continue
        lo, hi = _cut(size, p, parts, 1), _cut(size, p + 1, parts, 1)
        if kind == prefilter.CONV_FORWARD:
            prefilter._conv_abs_forward(a, b, bias, pos[lo:hi], geometry, groups, out[lo:hi])
        elif kind == prefilter.CONV_INPUT:
            prefilter._conv_abs_input(a, b, pos[lo:hi], geometry, groups, shape, out[lo:hi])
        else:
            prefilter._conv_abs_weight(a, b, pos[lo:hi], geometry, groups, shape, out[lo:hi])


@njit(cache=True, nogil=True)
def _conv_abs_block(parts: int, kind: int, a: np.ndarray, b: np.ndarray, bias: np.ndarray, pos: np.ndarray,
                    geometry: np.ndarray, groups: int, shape: np.ndarray, out: np.ndarray) -> np.ndarray:
    block = _new_block(parts, _C_FIELDS, 0)
    block[2], block[3], block[8] = kind, a.ctypes.data, b.ctypes.data
    for i in range(4):
        block[4 + i], block[9 + i] = a.shape[i], b.shape[i]
    block[13], block[14], block[15], block[16] = bias.ctypes.data, bias.size, pos.ctypes.data, pos.size
    block[17], block[18], block[19] = geometry.ctypes.data, geometry.size, groups
    block[20], block[21] = shape.ctypes.data, out.ctypes.data
    return block


def conv_abs(parts: int, kind: int, a: np.ndarray, b: np.ndarray, bias: np.ndarray, pos: np.ndarray,
             geometry: np.ndarray, groups: int, shape: np.ndarray, out: np.ndarray) -> None:
    """`prefilter._conv_abs`'s kernel of `kind` at C-contiguous float64 operands, in `parts` runs of the positions
    `pos`: out as the one pass's, bit for bit."""
    _require(np.float64, a, b, bias, out)
    _require(np.int64, pos, geometry, shape)
    omp.run(_conv_abs_part.address, _conv_abs_block(parts, kind, a, b, bias, pos, geometry, groups, shape, out), parts)


# prefilter._squares (float64): fields x (address, four dims), pixel, plane, row (addresses; 0: not wanted); two
# slots a part: its largest |x| as bits and its count of tiny values. Parts are whole images.
_Q_FIELDS = 8


@cfunc(_SIGNATURE, cache=True, error_model="numpy")
def _squares_part(d):  # noqa: ANN001, ANN202
    blk = carray(d, _HEAD + _Q_FIELDS + 2 * d[1])
    parts, n, c, h, w = blk[1], blk[3], blk[4], blk[5], blk[6]
    x = carray(_pointer(blk[2], np.float64), (n, c, h, w))
    pixel = carray(_pointer(blk[7], np.float64), (n if blk[7] else 0, h, w))
    plane = carray(_pointer(blk[8], np.float64), (n if blk[8] else 0, c))
    row = carray(_pointer(blk[9], np.float64), (n if blk[9] else 0, c, h))
    for j in range(parts):
        p = _part(d, j, parts)
        if p < 0:
            continue
        lo, hi = _cut(n, p, parts, 1), _cut(n, p + 1, parts, 1)
        at = _HEAD + _Q_FIELDS + 2 * p
        blk[at], blk[at + 1] = prefilter._squares(x[lo:hi], pixel[lo:hi], plane[lo:hi], row[lo:hi])


@njit(cache=True, nogil=True)
def _squares_block(parts: int, x: np.ndarray, pixel: np.ndarray, plane: np.ndarray, row: np.ndarray) -> np.ndarray:
    block = _new_block(parts, _Q_FIELDS, 2)
    block[2] = x.ctypes.data
    for i in range(4):
        block[3 + i] = x.shape[i]
    block[7] = pixel.ctypes.data if pixel.size else 0
    block[8] = plane.ctypes.data if plane.size else 0
    block[9] = row.ctypes.data if row.size else 0
    return block


def squares(parts: int, x: np.ndarray, pixel: np.ndarray, plane: np.ndarray, row: np.ndarray) -> tuple[int, int]:
    """`prefilter._squares` over a C-contiguous float64 (N, C, H, W) x in `parts` parts of whole images (at most N):
    the sums (each image's on one thread, in the one pass's order) and the answer, bit for bit."""
    _require(np.float64, x, pixel, plane, row)
    block = _squares_block(parts, x, pixel, plane, row)
    omp.run(_squares_part.address, block, parts)
    return _slot_max(block, 2, 0), _slot_sum(block, 2, 1)


# prefilter._window_norms (kind 0) and _cover_norms (kind 1): fields kind, sq (address, three dims), geometry (address,
# size), kh, kw, h, wd (the input's height and width: the cover's), out (address, two dims). Parts are whole images.
_W_FIELDS = 14


@cfunc(_SIGNATURE, cache=True, error_model="numpy")
def _window_part(d):  # noqa: ANN001, ANN202
    blk = carray(d, _HEAD + _W_FIELDS)
    parts, kind, n = blk[1], blk[2], blk[4]
    sq = carray(_pointer(blk[3], np.float64), (n, blk[5], blk[6]))
    geometry = carray(_pointer(blk[7], np.int64), blk[8])
    kh, kw, h, wd = blk[9], blk[10], blk[11], blk[12]
    out = carray(_pointer(blk[13], np.float64), (blk[14], blk[15]))
    for j in range(parts):
        p = _part(d, j, parts)
        if p < 0:
            continue
        lo, hi = _cut(n, p, parts, 1), _cut(n, p + 1, parts, 1)
        if kind == 0:
            prefilter._window_norms(sq[lo:hi], geometry, kh, kw, out[lo:hi])
        else:
            prefilter._cover_norms(sq[lo:hi], geometry, kh, kw, h, wd, out[lo:hi])


@njit(cache=True, nogil=True)
def _window_block(parts: int, cover: bool, sq: np.ndarray, geometry: np.ndarray, kh: int, kw: int, h: int, wd: int,
                  out: np.ndarray) -> np.ndarray:
    block = _new_block(parts, _W_FIELDS, 0)
    block[2], block[3], block[4], block[5], block[6] = cover, sq.ctypes.data, sq.shape[0], sq.shape[1], sq.shape[2]
    block[7], block[8], block[9], block[10], block[11], block[12] = geometry.ctypes.data, geometry.size, kh, kw, h, wd
    block[13], block[14], block[15] = out.ctypes.data, out.shape[0], out.shape[1]
    return block


def window_norms(parts: int, cover: bool, sq: np.ndarray, geometry: np.ndarray, kh: int, kw: int, h: int, wd: int,
                 out: np.ndarray) -> None:
    """`prefilter._window_norms` (cover False; h and wd unused) or `_cover_norms` over C-contiguous float64 squares
    in `parts` parts of whole images: out as the one pass's, bit for bit."""
    _require(np.float64, sq, out)
    _require(np.int64, geometry)
    omp.run(_window_part.address, _window_block(parts, cover, sq, geometry, kh, kw, h, wd, out), parts)
