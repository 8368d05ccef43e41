"""vtrain.omp: a pass split in parts across torch's OpenMP threads gives the whole pass's results bit for bit,
for any number of parts: the rounded outputs, the candidates in order with their held values, the count and
first position of values off the grid. (Training under two threads against one: tests/families/
test_family_threads.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vtrain import fused, fused_binary, fused_optim, omp, omp_kernels, prefilter
from vtrain.grid import grid_max

aten = torch.ops.aten
LIMIT = grid_max(32)
PARTS = (2, 3, 5)


def _values(rng: np.random.Generator, size: int) -> np.ndarray:
    """Float64 values with the hard cases sprinkled in: float32 midpoints (ties), near-ties, zeros of both
    signs, subnormal-range values, values beyond float32's range, infinities and NaN."""
    v = rng.standard_normal(size) * 2.0 ** rng.integers(-30, 30, size)
    grid = v.astype(np.float32).astype(np.float64)
    ties = grid + np.spacing(grid.astype(np.float32)).astype(np.float64) / 2
    pick = rng.integers(0, 12, size)
    v = np.where(pick == 0, ties, v)
    v = np.where(pick == 1, ties * (1 + 2.0**-50), v)
    v = np.where(pick == 2, rng.choice([0.0, -0.0], size), v)
    v = np.where(pick == 3, v * 2.0**-140, v)
    v[rng.integers(0, size, 3)] = [1e39, np.inf, np.nan]
    return v


def _same(a: tuple, b: tuple) -> bool:
    return all(np.array_equal(x, y, equal_nan=True) if isinstance(x, np.ndarray) else x == y for x, y in zip(a, b))


@pytest.mark.parametrize("code", [fused_binary.ADD, fused_binary.SUB, fused_binary.MUL, fused_binary.DIV,
                                  fused_binary.TANH_BACKWARD])
@pytest.mark.parametrize("shapes", [((64, 300), (64, 300)), ((64, 300), (300,)), ((5, 7, 40), (5, 7, 1)),
                                    ((3, 4, 7, 73), (3, 1, 7, 1)), ((9, 4000), ())])
def test_binary_in_parts(code: int, shapes: tuple) -> None:
    rng = np.random.default_rng(code)
    x = torch.from_numpy(_values(rng, int(np.prod(shapes[0]))).reshape(shapes[0]))
    y = torch.from_numpy(_values(rng, int(np.prod(shapes[1]))).reshape(shapes[1])) if shapes[1] else 2.5
    plan = fused_binary._plan(fused_binary._key(x), fused_binary._key(y))
    a, b = fused_binary._memory(x, plan.x_span), fused_binary._memory(y, plan.y_span)
    for in_place in (False, True):
        whole_out = None if in_place else np.empty(plan.size)
        whole_a = a.copy()
        whole = fused_binary._binary(code, whole_a, plan.sa, b, plan.sb, plan.dims, whole_out, 23, True, LIMIT,
                                     0, plan.size)
        for parts in PARTS:
            part_a, out = a.copy(), None if in_place else np.empty(plan.size)
            nbad = omp_kernels.binary(parts, code, part_a, plan.sa, b, plan.sb, plan.dims, out, 23, True, LIMIT,
                                      plan.size)
            assert nbad == whole > 0
            got, want = (part_a, whole_a) if in_place else (out, whole_out)
            assert np.array_equal(got, want, equal_nan=True)


def test_without_libgomp_a_pass_runs_every_part_on_this_thread() -> None:
    """Where torch's threads are not libgomp's, `launch` calls a stand-in (`omp_kernels._ALONE`) that runs the
    callback once, on this thread: it takes every part in turn, so the pass is the whole one's."""
    rng = np.random.default_rng(11)
    x, y = (torch.from_numpy(_values(rng, 3000).reshape(30, 100)) for _ in range(2))
    plan = fused_binary._plan(fused_binary._key(x), fused_binary._key(y))
    a, b = fused_binary._memory(x, plan.x_span), fused_binary._memory(y, plan.y_span)
    whole_out, out = np.empty(plan.size), np.empty(plan.size)
    whole = fused_binary._binary(fused_binary.MUL, a, plan.sa, b, plan.sb, plan.dims, whole_out, 23, True, LIMIT, 0,
                                 plan.size)
    block = omp_kernels._binary_block(3, fused_binary.MUL, a, plan.sa, b, plan.sb, plan.dims, out, 23, True, LIMIT,
                                      plan.size)
    omp_kernels._ALONE(omp_kernels._binary_part.address, block.ctypes.data, 3, 0)
    assert omp_kernels._slot_sum(block, 1, 0) == whole > 0
    assert np.array_equal(out, whole_out, equal_nan=True)


def _near(kind: str, v: np.ndarray, e: np.ndarray, out_is_v: bool, parts: int) -> tuple:
    v = v.copy()
    out = v if out_is_v else np.empty_like(v)
    cand, held = np.full(v.size, -7, np.int64), np.full(v.size, -7.0)
    relative = (2.0**-40, 2.0**-1000, 1.5, 0.0)
    if parts == 1:
        if kind == "relative":
            count, bad = fused._round_near32_relative(v, *relative, 1.0, LIMIT, out, cand, held, -0.0)
        else:
            count, bad = fused._round_near32(v, e, 1.0, LIMIT, out, cand, held, -0.0)
    else:
        count, bad = omp_kernels.round_near32(parts, v, None if kind == "relative" else e, out, cand, held, 1.0,
                                              LIMIT, -0.0, relative if kind == "relative" else (0.0,) * 4)
    return count, bad, out.copy(), cand[:count].copy(), held[:count].copy()


@pytest.mark.parametrize("kind", ["band", "one band", "relative"])
def test_rounding_near_boundaries_in_parts(kind: str) -> None:
    rng = np.random.default_rng(1)
    v = _values(rng, 3 * fused.NEAR_BLOCK + 77)
    e = {"band": np.abs(v) * 2.0**-45, "one band": np.array([2.0**-60]), "relative": None}[kind]
    for out_is_v in (False, True):
        whole = _near(kind, v, e, out_is_v, 1)
        assert whole[0] > 10 and whole[1] >= 0  # candidates in several parts, and a value off the grid
        for parts in PARTS:
            assert _same(_near(kind, v, e, out_is_v, parts), whole)


def _outer(v: np.ndarray, rows, cols, add, sa, sb, out_is_v: bool, parts: int) -> tuple:
    v = v.copy()
    out = v if out_is_v else np.empty_like(v)
    cand, held = np.full(v.size, -7, np.int64), np.full(v.size, -7.0)
    if parts == 1:
        count, bad = fused._round_near32_outer(v, rows, cols, add, 1.0, LIMIT, out, cand, held, -0.0, sa, sb)
    else:
        count, bad = omp_kernels.round_near32_outer(parts, v, rows, cols, add, 1.0, LIMIT, out, cand, held, -0.0,
                                                    sa, sb)
    return count, bad, out.copy(), cand[:count].copy(), held[:count].copy()


@pytest.mark.parametrize("batches,m,n,words", [(1, 37, 300, 0), (1, 41, 129, 2), (6, 9, 50, 1), (2, 30, 20, 0)])
def test_matmul_prefilter_in_parts(batches: int, m: int, n: int, words: int) -> None:
    """Whole rows of one matrix, or whole batches, with and without the nonzero-term bitsets."""
    rng = np.random.default_rng(m)
    v = _values(rng, batches * m * n)
    v[rng.integers(0, v.size, v.size // 20)] = 0.0  # exact zeros, which the bitsets may drop
    rows = np.abs(rng.standard_normal((batches, m))) * 2.0**-29
    cols, add = np.abs(rng.standard_normal((batches, n))), np.abs(rng.standard_normal((batches, n))) * 2.0**-60
    if words:
        sa = rng.integers(0, 2**63, (batches, m, words), dtype=np.uint64) & rng.integers(0, 2**63, (batches, m, words),
                                                                                         dtype=np.uint64)
        sb = rng.integers(0, 2**63, (batches, n, words), dtype=np.uint64) & rng.integers(0, 2**63, (batches, n, words),
                                                                                         dtype=np.uint64)
        sa[:, ::3] = 0
    else:
        sa = sb = np.zeros((0, 0, 0), np.uint64)
    for out_is_v in (False, True):
        whole = _outer(v, rows, cols, add, sa, sb, out_is_v, 1)
        assert whole[0] > 10 and whole[1] >= 0
        for parts in PARTS:
            assert _same(_outer(v, rows, cols, add, sa, sb, out_is_v, parts), whole)


@pytest.mark.parametrize("m,k", [(1030, 600), (600, 100), (257, 40)])
def test_prefilter_norms_in_parts(m: int, k: int) -> None:
    """Whole row blocks of one matrix (the last one short) and whole batches: the rows' and columns' norms and the
    flags (finite, tiny values, the most zeros in a row and in a column) of the one pass, bit for bit."""
    rng = np.random.default_rng(m)
    x = rng.standard_normal((m, k)) * 2.0 ** rng.integers(-20, 20, (m, k))
    x[rng.random(x.shape) < 0.3] = 0
    x[m // 2] = 0  # a row of zeros only (left out of the most zeros)
    x[m - 1, 0], x[m - 1, 1:] = 1.0, 0  # the row with the most zeros
    x[3, 2] = 1e-300  # a tiny value
    rows, cols = np.empty(m), np.empty(k)
    whole = prefilter._norms_both(x, rows, cols)
    assert whole[1] == 1 and whole[2] == k - 1
    for parts in PARTS:
        parts = min(parts, prefilter.norm_blocks(m))
        got_rows, got_cols = np.empty(m), np.empty(k)
        assert omp_kernels.norms(parts, x, got_rows, got_cols) == whole
        assert np.array_equal(got_rows, rows) and np.array_equal(got_cols, cols)
    x[1, 0] = np.inf
    batched = x[:(m // 8) * 8].reshape(8, m // 8, k)
    rows, cols = np.empty(batched.shape[:2]), np.empty((8, k))
    whole = prefilter._norms_batched(batched, rows, cols)
    assert not whole[0]
    for parts in PARTS:
        got_rows, got_cols = np.empty_like(rows), np.empty_like(cols)
        assert omp_kernels.norms_batched(parts, batched, got_rows, got_cols) == whole
        assert np.array_equal(got_rows, rows, equal_nan=True) and np.array_equal(got_cols, cols, equal_nan=True)


def _noted_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The (kernel, parts) of every split pass from here on, in order (each still runs)."""
    ran, run = [], omp.run

    def noting(kernel: int, block: np.ndarray, parts: int) -> None:
        ran.append((kernel, parts))
        run(kernel, block, parts)

    monkeypatch.setattr(omp, "run", noting)
    return ran


def test_prefilter_takes_the_split_norms_where_passes_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """`prefilter._both_norms` hands a float64 matrix of several row blocks, and a batch, to the split kernels where
    vtrain.omp splits passes: the one pass's norms and flags."""
    rng = np.random.default_rng(8)
    matrix, batch = rng.standard_normal((1, 600, 300)), rng.standard_normal((6, 40, 50))
    rows, cols = np.empty((1, 600)), np.empty((1, 300))
    flags = prefilter._norms_both(matrix[0], rows[0], cols[0])
    want = [(rows, cols, (flags[0] and flags[1] == 0, flags[2], flags[3]))]
    rows, cols = np.empty((6, 40)), np.empty((6, 50))
    flags = prefilter._norms_batched(batch, rows, cols)
    want.append((rows, cols, (flags[0] and flags[1] == 0, flags[2], flags[3])))
    ran = _noted_runs(monkeypatch)
    monkeypatch.setattr(omp, "parts", lambda size: 2)
    for x, (rows, cols, flags), kernel in zip((matrix, batch), want,
                                              (omp_kernels._norms_part, omp_kernels._norms_batched_part)):
        got = prefilter._both_norms(x)
        assert np.array_equal(got[0], rows) and np.array_equal(got[1], cols) and got[2] == flags
        assert ran.pop() == (kernel.address, 2)


@pytest.mark.parametrize("geometry", [([1, 1], [1, 1], [1, 1], 1), ([2, 1], [0, 2], [1, 2], 2),
                                      ([1, 3], [3, 0], [2, 1], 1)], ids=["3x3", "strided-grouped", "dilated-padded"])
def test_convolution_e_at_positions_in_parts(geometry: tuple) -> None:
    """E's sums of |terms| at a convolution's positions (forward, input and weight gradients) in runs of positions
    on several threads: each position's sum as the one pass's, bit for bit, whatever the positions' order."""
    stride, padding, dilation, groups = geometry
    gen, rng = torch.Generator().manual_seed(groups), np.random.default_rng(groups)
    x = torch.randn(3, 4 * groups, 11, 9, generator=gen, dtype=torch.float64) * 2.0 ** 40
    w = torch.randn(6 * groups, 4, 3, 2, generator=gen, dtype=torch.float64)
    bias = torch.randn(6 * groups, generator=gen, dtype=torch.float64)
    v = aten.convolution.default(x, w, bias, stride, padding, dilation, False, [0, 0], groups)
    g = torch.randn(v.shape, generator=gen, dtype=torch.float64)
    geo = np.array([*stride, *padding, *dilation, *v.shape[-2:]], np.int64)
    for kind, a, b, size, shape in ((prefilter.CONV_FORWARD, x, w, v.numel(), x.shape),
                                    (prefilter.CONV_INPUT, g, w, x.numel(), x.shape),
                                    (prefilter.CONV_WEIGHT, g, x, w.numel(), w.shape)):
        a, b, shape = a.numpy(), b.numpy(), np.array(shape, np.int64)
        biases = bias.numpy() if kind == prefilter.CONV_FORWARD else np.zeros(0)
        pos = rng.permutation(size)[:size // 2 + 7]
        whole = np.empty(pos.size)
        prefilter._conv_abs(kind, a, b, biases, pos, geo, groups, shape, whole)  # (too few terms to split)
        assert (whole > 0).sum() > pos.size // 2  # (a stride skips some input pixels: no terms there)
        for parts in PARTS:
            out = np.empty(pos.size)
            omp_kernels.conv_abs(parts, kind, a, b, biases, pos, geo, groups, shape, out)
            assert np.array_equal(out, whole), (kind, parts)


def test_convolution_e_takes_the_split_kernel_where_passes_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """`prefilter._conv_abs` hands float64 operands with many terms to the split kernel, float32 ones to the one
    pass: the same sums."""
    rng = np.random.default_rng(5)
    g, x = rng.standard_normal((4, 3, 20, 20)), rng.standard_normal((4, 2, 20, 20))
    geo, shape, pos = np.array([1, 1, 1, 1, 1, 1], np.int64), np.array([3, 2, 3, 3], np.int64), np.arange(0, 54, 5)
    want = np.empty(pos.size)
    prefilter._conv_abs(prefilter.CONV_WEIGHT, g, x, np.zeros(0), pos, geo, 1, shape, want)
    ran = _noted_runs(monkeypatch)
    monkeypatch.setattr(omp, "parts", lambda size, least=None: 2 if size >= 2 * least else 1)
    monkeypatch.setattr(prefilter, "_SPLIT_TERMS", 1000)  # (11 positions of 1,600 terms)
    got = np.empty(pos.size)
    prefilter._conv_abs(prefilter.CONV_WEIGHT, g, x, np.zeros(0), pos, geo, 1, shape, got)
    assert np.array_equal(got, want) and ran == [(omp_kernels._conv_abs_part.address, 2)]
    got32 = np.empty(pos.size)
    prefilter._conv_abs(prefilter.CONV_WEIGHT, g.astype(np.float32), x.astype(np.float32), np.zeros(0), pos, geo, 1,
                        shape, got32)
    assert len(ran) == 1 and np.allclose(got32, want, rtol=2.0**-20)


@pytest.mark.parametrize("wanted", [(True, True, True), (True, False, False), (False, True, True)],
                         ids=["all", "pixels", "planes-rows"])
def test_convolution_squares_in_parts(wanted: tuple) -> None:
    """A convolution operand's sums of squares (pixels across channels, rows, planes) in parts of whole images: each
    image's sums and the answer (the largest |x|, the count of tiny values) as the one pass's, bit for bit; the
    sums not wanted stay unwritten."""
    rng = np.random.default_rng(len(wanted))
    x = rng.standard_normal((7, 5, 6, 9)) * 2.0 ** rng.integers(-30, 30, (7, 5, 6, 9))
    x[4, 2, 1, 3], x[1, 0, 0, 0] = 1e-300, -7e20  # a tiny value; the largest in an image no part starts with

    def arrays() -> list[np.ndarray]:
        shapes = ((7, 6, 9), (7, 5), (7, 5, 6))
        return [np.full(shape, -1.0) if want else np.empty((0,) * len(shape)) for shape, want in zip(shapes, wanted)]

    whole = arrays()
    answer = prefilter._squares(x, *whole)
    assert answer == (np.float64(7e20).view(np.int64), 1)
    for parts in PARTS:
        got = arrays()
        assert omp_kernels.squares(parts, x, *got) == answer
        assert all(np.array_equal(a, b) for a, b in zip(got, whole))


def test_convolution_squares_take_the_split_kernel_where_passes_split(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3, 8, 8))
    want = [np.empty((4, 8, 8)), np.empty((4, 3)), np.empty((4, 3, 8))]
    answer = prefilter._squares(x, *want)
    ran = _noted_runs(monkeypatch)
    monkeypatch.setattr(omp, "parts", lambda size: 3)
    got = [np.empty_like(a) for a in want]
    assert prefilter._squares_of(x, *got) == answer and all(np.array_equal(a, b) for a, b in zip(got, want))
    assert ran == [(omp_kernels._squares_part.address, 3)]
    x32 = x.astype(np.float32)
    assert prefilter._squares_of(x32, *got) == prefilter._squares(x32, *want) and len(ran) == 1  # (the one pass)


@pytest.mark.parametrize("geometry", [(1, 1, 1, 1, 1, 1), (2, 1, 0, 2, 1, 2), (1, 3, 3, 0, 2, 1)],
                         ids=["3x3", "strided", "dilated-padded"])
def test_convolution_window_and_cover_norms_in_parts(geometry: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """The forward pre-filter's window norms and the input gradient's cover norms in parts of whole images (and
    through `prefilter._norms_over` where passes split): the one pass's, bit for bit."""
    rng = np.random.default_rng(sum(geometry))
    s0, s1, p0, p1, d0, d1 = geometry
    kh, kw, h, w = 3, 2, 11, 9
    oh, ow = (h + 2 * p0 - d0 * (kh - 1) - 1) // s0 + 1, (w + 2 * p1 - d1 * (kw - 1) - 1) // s1 + 1
    pixels, out_pixels = rng.random((5, h, w)) * 2.0 ** 60, rng.random((5, oh, ow))
    window, cover = np.array([*geometry, oh, ow], np.int64), np.array(geometry, np.int64)
    want_window, want_cover = np.empty((5, oh * ow)), np.empty((5, h * w))
    prefilter._window_norms(pixels, window, kh, kw, want_window)
    prefilter._cover_norms(out_pixels, cover, kh, kw, h, w, want_cover)
    for parts in PARTS:
        got_window, got_cover = np.empty_like(want_window), np.empty_like(want_cover)
        omp_kernels.window_norms(parts, False, pixels, window, kh, kw, 0, 0, got_window)
        omp_kernels.window_norms(parts, True, out_pixels, cover, kh, kw, h, w, got_cover)
        assert np.array_equal(got_window, want_window) and np.array_equal(got_cover, want_cover)
    ran = _noted_runs(monkeypatch)
    monkeypatch.setattr(omp, "parts", lambda size: 2)
    got_window, got_cover = np.empty_like(want_window), np.empty_like(want_cover)
    prefilter._norms_over(False, pixels, window, kh, kw, 0, 0, got_window)
    prefilter._norms_over(True, out_pixels, cover, kh, kw, h, w, got_cover)
    assert np.array_equal(got_window, want_window) and np.array_equal(got_cover, want_cover)
    assert ran == [(omp_kernels._window_part.address, 2)] * 2


@pytest.mark.parametrize(("co_g", "groups"), [(6, 1), (6, 2), (3, 2)])
def test_convolution_weight_sums_in_parts(co_g: int, groups: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The weight gradient pre-filter's sums of row-norm products (`prefilter._row_dots`, four rows of a group at a
    time and the rest one by one) in parts of whole columns (more parts than columns too), and through
    `prefilter._weight_sums` where passes split: the one pass's, bit for bit, and each the dot product of its row
    and line within float64's roundings."""
    rng = np.random.default_rng(co_g + groups)
    width, length = 7, 301  # (groups of six rows: a block of four and two alone; of three: all alone)
    g = rng.random((co_g * groups, length)) * 2.0 ** rng.integers(-20, 20, (co_g * groups, length))
    taps = rng.random((width * groups, length))
    whole = np.full((co_g * groups, width), np.nan)
    prefilter._row_dots(g, taps, co_g, 0, width, whole)
    exact = np.array([[g[co] @ taps[co // co_g * width + t] for t in range(width)] for co in range(co_g * groups)])
    assert np.allclose(whole, exact, rtol=length * 2.0**-52, atol=0)
    for parts in (*PARTS, width, width + 3):
        got = np.full_like(whole, np.nan)
        omp_kernels.row_dots(parts, g, taps, co_g, got)
        assert np.array_equal(got, whole)
    for parts, rows, taps_given in ((2, co_g, taps[1:]), (0, co_g, taps), (2, 0, taps)):
        with pytest.raises(ValueError, match="row_dots"):
            omp_kernels.row_dots(parts, g, taps_given, rows, whole)
    g_rows, x_rows = rng.random((3, 4 * groups, 10)), rng.random((3, 2 * groups, 20))
    args = (g_rows, x_rows, (2, 2), (1, 1), (1, 1), groups, 3, 3)
    want = prefilter._weight_sums(*args)
    ran = _noted_runs(monkeypatch)
    monkeypatch.setattr(omp, "parts", lambda size, least=None: 2)
    assert np.array_equal(prefilter._weight_sums(*args), want)
    assert ran == [(omp_kernels._dots_part.address, 2)]


def test_rounding_in_parts() -> None:
    rng = np.random.default_rng(2)
    v = _values(rng, 5 * fused.NEAR_BLOCK + 3)
    for in_place in (False, True):
        whole_v, whole_out = v.copy(), np.empty_like(v)
        if in_place:
            whole = fused._round_in_place(whole_v, 23, True, LIMIT)
        else:
            whole = fused._round_into(v, v.view(np.int64), 52, 0x7FF, 1023, whole_out, 23, True, LIMIT)
        for parts in PARTS:
            part_v, out = v.copy(), np.empty_like(v)
            bad = omp_kernels.round_float64(parts, part_v, None if in_place else out, 23, LIMIT)
            assert bad == whole >= 0
            assert np.array_equal(part_v if in_place else out, whole_v if in_place else whole_out, equal_nan=True)


@pytest.mark.parametrize("shape", [(1, 97, 256), (3, 40, 300), (2, 5, 7), (4, 11, 64)])
def test_line_sums_in_parts(shape: tuple) -> None:
    """The CPU device's line sums (lanes of SUM_LANES and their halving trees) of each kept element on one thread:
    the whole pass's sums and sums of |x|, NaN and infinities included."""
    rng = np.random.default_rng(shape[1])
    x = _values(rng, int(np.prod(shape))).reshape(shape)
    x[:, 1] = rng.standard_normal((shape[0], shape[2]))  # (an element free of NaN and infinities: sums to compare)
    want = np.empty(shape[1]), np.empty(shape[1])
    fused._lane_sums_with_abs(x, *want, 3.0, 0, shape[1])
    assert np.isfinite(want[0][1])
    for parts in PARTS:
        got = np.full(shape[1], -7.0), np.full(shape[1], -7.0)
        omp_kernels.lane_sums_with_abs(parts, x, *got, 3.0)
        assert all(np.array_equal(g, w, equal_nan=True) for g, w in zip(got, want))


def _optimizer_group(rng: np.random.Generator, sizes: tuple, arrays: int) -> list[list[np.ndarray]]:
    """(p, g, m1, m2) or (p, g, buf) per parameter: float32 values, m2 their squares (a second moment)."""
    group = []
    for n in sizes:
        values = [rng.standard_normal(n).astype(np.float32).astype(np.float64) for _ in range(3)]
        group.append([*values, (values[2] ** 2).astype(np.float32).astype(np.float64)][:arrays])
    return group


@pytest.mark.parametrize("m", [23, 15])
@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_optimizer_updates_in_parts(kind: str, m: int) -> None:
    """A group's Adam or SGD updates as one pass cut across its parameters: each parameter's values and state as
    its own update's, for any number of parts; the first parameter whose update left the grid, with its flags."""
    rng = np.random.default_rng(m)
    sizes = (300, 7, 4096, 1, 999)
    if kind == "adam":
        code, kernel, arrays = omp_kernels.ADAM, fused_optim._adam, 4
        coefficients = [(1 - 3e-4 * i, 0.01 * (i % 2), 0.1, 0.999, 0.001, 0.5 + i, 1e-8, -3e-3)
                        for i in range(len(sizes))]
    else:
        code, kernel, arrays = omp_kernels.SGD, fused_optim._sgd, 3
        coefficients = [(i == 1, 0.01 * (i % 2), 0.9 * (i != 3), 1 - 0.25 * (i % 3), -0.05) for i in range(len(sizes))]
    group = _optimizer_group(rng, sizes, arrays)
    group[2][1][4000] = np.inf  # parameter 2's gradient: its state or value leaves the grid
    group[4][0][5] = 2.0 * LIMIT  # parameter 4 starts off the grid
    want = [[a.copy() for a in arrays] for arrays in group]
    flags = [kernel(*arrays, *c, m, m == 23, LIMIT, 0, arrays[0].size) for arrays, c in zip(want, coefficients)]
    assert flags[2] and flags[4] & 1 and not any(flags[i] for i in (0, 1, 3))
    for parts in PARTS:
        got = [[a.copy() for a in arrays] for arrays in group]
        assert omp_kernels.update(code, parts, got, coefficients, m, LIMIT) == (2, flags[2])
        assert all(np.array_equal(g, w, equal_nan=True) for gs, ws in zip(got, want) for g, w in zip(gs, ws))
    got = [[a.copy() for a in arrays] for arrays in group[3:]]
    assert omp_kernels.update(code, 2, got, coefficients[3:], m, LIMIT) == (1, flags[4])


def test_parts_follow_torch_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass splits in torch's thread count where torch runs on libgomp (torch's Linux wheels, which CI installs),
    parts of MIN_VALUES at least; one thread, a small pass, or the switch off: whole. Elsewhere it never splits."""
    gnu = omp.parallel_address() is not None
    size = 10 * omp.MIN_VALUES
    torch.set_num_threads(4)
    try:
        assert omp.parts(size) == (4 if gnu else 1) and omp.parts(3 * omp.MIN_VALUES) == (3 if gnu else 1)
        assert omp.parts(omp.MIN_VALUES) == 1
        monkeypatch.setattr(omp, "ENABLED", False)
        assert omp.parts(size) == 1
    finally:
        torch.set_num_threads(1)
    monkeypatch.setattr(omp, "ENABLED", True)
    assert omp.parts(size) == 1


def test_the_split_kernels_refuse_arrays_they_would_misread() -> None:
    v = np.zeros(8)
    cand, held = np.zeros(8, np.int64), np.zeros(8)
    with pytest.raises(TypeError, match="C-contiguous float64"):
        omp_kernels.round_near32(2, v, np.zeros(8, np.float32), v, cand, held, 1.0, LIMIT, -0.0)
    with pytest.raises(TypeError, match="C-contiguous float64"):
        omp_kernels.round_float64(2, np.zeros(16)[::2], None, 23, LIMIT)
