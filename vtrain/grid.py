"""The target grid: FP32-shaped numbers that keep `bits - 9` mantissa bits (DESIGN.md §1.1).

A grid with `bits` total bits has FP32's 8-bit exponent and m = bits - 9 explicit mantissa bits, so
bits = 32 is plain FP32. Training values live in the work dtype (float64, or float32 for the scale
model) but exactly on this grid.

Conventions (tested against an exact `fractions.Fraction` reference in tests/numerics/):
- Rounding is round-to-nearest, ties-to-even on the m-bit grid, straight from the input value (never via
  FP32 first: that double rounding is wrong on a few percent of values at m < 23).
- Below the normal range (|x| < 2^-126) the grid is uniform with spacing 2^(-126-m), the spacing of the
  lowest normal binade (gradual underflow with m bits). At bits = 32 this is exactly the FP32 subnormal
  grid (2^-149).
- The largest grid value is (2 - 2^-m) * 2^127. A value that rounds beyond it (or NaN, or inf) raises
  `GridOverflowError`: training that overflows has diverged, and we never hand back an infinity.
- `rev(x, up)` is the neighbouring grid value toward +inf (up=True) or toward -inf (up=False). The
  rounding log uses the same convention: a direction bit "up" means the value was rounded to the upper
  neighbour of the boundary (the one toward +inf).

Everything is vectorised (exponent bits from int64/int32 views, exact power-of-two scaling, torch.round);
no loops over ulps.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from vtrain.errors import VtrainError

MIN_BITS = 10
MAX_BITS = 32
_MIN_NORMAL = 2.0**-126


class GridError(VtrainError):
    """A grid operation got an argument it cannot handle (bits out of range, unsupported dtype)."""


class GridOverflowError(GridError):
    """A value is NaN or infinite, or rounds beyond the largest grid value (the run diverged)."""


def check_bits(bits: int) -> int:
    """Return `bits - 9` (the mantissa width) after checking 10 <= bits <= 32."""
    if not isinstance(bits, int) or not MIN_BITS <= bits <= MAX_BITS:
        raise GridError(f"bits must be an integer in {MIN_BITS}..{MAX_BITS}, got {bits!r}")
    return bits - 9


def grid_max(bits: int) -> float:
    """The largest finite grid value, (2 - 2^-m) * 2^127."""
    m = check_bits(bits)
    return (2.0 - 2.0**-m) * 2.0**127


def _overflow_threshold(m: int) -> float:
    # Midpoint between the largest grid value and 2^128: RNE sends it (odd last bit) and anything above
    # to infinity, so |x| >= this overflows.
    return (2.0 - 2.0 ** -(m + 1)) * 2.0**127


def _int_view(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(integer view, explicit mantissa width of the dtype, sign-free exponent mask)."""
    if x.dtype == torch.float64:
        return x.view(torch.int64), 52, 0x7FF0000000000000
    if x.dtype == torch.float32:
        return x.view(torch.int32), 23, 0x7F800000
    raise GridError(f"the grid works on float64 or float32 tensors, got {x.dtype}")


def check_finite_range(x: torch.Tensor, bits: int) -> None:
    """Raise GridOverflowError unless every element is finite and rounds to a finite grid value."""
    n = x.numel()
    if n == 0:
        return
    thr = _overflow_threshold(bits - 9)
    if n == 1:  # (a step counter, a loss: one read instead of a reduction and two reads)
        lo = hi = x.item()
    else:
        lo, hi = (v.item() for v in torch.aminmax(x))
    # NaN fails both comparisons, so it is caught here too. (Python comparisons: fewer torch calls.)
    if not (-thr < lo and hi < thr):
        bad = x[~((x > -thr) & (x < thr))].reshape(-1)[:1].item()
        raise GridOverflowError(
            f"value {bad!r} is NaN, infinite or beyond the largest grid value {grid_max(bits)!r} "
            f"(bits={bits}): the computation diverged"
        )


def round_unchecked(x: torch.Tensor, bits: int) -> torch.Tensor:
    """RNE onto the grid without the overflow/NaN check (callers check the range once themselves)."""
    m = check_bits(bits)
    if x.dtype == torch.float32 and m == 23:  # every finite float32 is on the FP32 grid
        return x.clone()
    if x.dtype == torch.float64 and m == 23:
        # The hardware cast is RNE straight from the float64 value, FP32 subnormals included.
        return x.to(torch.float32).to(torch.float64)
    # q = the grid spacing at x (exponent bits of x, clamped to the lowest normal binade); x / q is exact
    # (a power of two) and lies below 2^(m+1), torch.round is half-to-even, and the product is exact.
    # A carry to 2^(m+1) lands correctly on the next binade; below 2^-126 the clamp gives the uniform
    # subnormal spacing. (Measured 7x faster than the integer add-and-mask trick on int64 views.)
    q = grid_ulp(x, bits)
    return torch.div(x, q).round_().mul_(q)


def round_to_grid(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Round `x` (float64 or float32) to nearest-even on the `bits`-bit grid; same dtype out.

    Raises GridOverflowError for NaN, inf, or values that round beyond the largest grid value.
    """
    check_bits(bits)
    _int_view(x)
    if x.dtype == torch.float64 and bits == 32:
        # The cast itself sends overflow to inf (and keeps NaN): check the float32 result, half the bytes.
        r32 = x.to(torch.float32)
        _check_cast(r32, x)
        return r32.to(torch.float64)
    check_finite_range(x, bits)
    return round_unchecked(x, bits)


def _check_cast(r32: torch.Tensor, x: torch.Tensor) -> None:
    if r32.numel() == 0:
        return
    lo, hi = torch.aminmax(r32)
    if not (-math.inf < lo.item() and hi.item() < math.inf):
        check_finite_range(x, 32)  # raises with the offending value


def grid_ulp(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Spacing of the grid at x: 2^(e-m) for 2^e <= |x| < 2^(e+1), and 2^(-126-m) below 2^-126.

    This is the spacing above |x| (toward larger magnitude); at an exact power of two the spacing toward
    zero is half of it.
    """
    m = check_bits(bits)
    ints, _, exp_mask = _int_view(x)
    pow2 = torch.bitwise_and(ints, exp_mask).view(x.dtype)  # 2^e for normal values, 0 for zero/subnormals
    return pow2.clamp_min_(_MIN_NORMAL).mul_(2.0**-m)


def spacing_below(r: torch.Tensor, bits: int) -> torch.Tensor:
    """For grid values r: the distance from |r| to the next grid value toward zero (r = 0: 2^(-126-m))."""
    m = check_bits(bits)
    # |r| * (1 - 2^-(m+1)) stays in r's binade unless |r| is a power of two, where it drops just below:
    # exactly the binade whose spacing is the one below r.
    return grid_ulp(r * (1.0 - 2.0 ** -(m + 1)), bits)


def spacings_np(r: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(spacing_below(r), grid_ulp(r)) for a numpy array of grid values, with the same bits.

    The same operations as the torch functions above, in numpy: the rounding log works on a handful of
    candidate values per op, where numpy's per-call cost is a fraction of torch's.
    """
    m = check_bits(bits)
    if r.dtype == np.float64:
        int_type, exp_mask = np.int64, 0x7FF0000000000000
    elif r.dtype == np.float32:
        int_type, exp_mask = np.int32, 0x7F800000
    else:
        raise GridError(f"the grid works on float64 or float32 arrays, got {r.dtype}")

    def ulp(x: np.ndarray) -> np.ndarray:
        pow2 = (x.view(int_type) & exp_mask).view(r.dtype)
        return np.maximum(pow2, r.dtype.type(_MIN_NORMAL)) * r.dtype.type(2.0**-m)

    return ulp(r * r.dtype.type(1.0 - 2.0 ** -(m + 1))), ulp(r)


def grid_index(r: np.ndarray, bits: int) -> np.ndarray:
    """The grid values r numbered in order (int64): ... -q -> -2, -0 -> -1, +0 -> 0, q -> 1, ... .

    A grid value's FP32 pattern is the index of its magnitude shifted left by 32 - bits, so consecutive
    grid values have consecutive indices across binades and subnormals alike. -0 is kept apart from +0
    (the rounding log must reproduce a signed zero); +-inf fall one step beyond the largest grid value.
    """
    check_bits(bits)
    patterns = np.asarray(r, np.float32).view(np.uint32)
    mag = ((patterns & np.uint32(0x7FFFFFFF)) >> np.uint32(32 - bits)).astype(np.int64)
    return np.where(patterns >> np.uint32(31) != 0, -mag - 1, mag)


def grid_at_index(k: np.ndarray, bits: int) -> np.ndarray:
    """The grid values (float64) with grid indices k, the inverse of `grid_index` on the finite grid."""
    check_bits(bits)
    mag = np.where(k < 0, -k - 1, k).astype(np.uint32) << np.uint32(32 - bits)
    values = mag.view(np.float32).astype(np.float64)
    return np.where(k < 0, -values, values)


def neighbours(r: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(lower, upper) grid neighbours of grid values r; beyond the largest grid value gives +-inf."""
    m = check_bits(bits)
    ints, mant, _ = _int_view(r)
    step = 1 << (mant - m)
    negative = ints < 0
    # In the integer view of a normal value, +-step moves the magnitude to the next grid value, carrying
    # or borrowing across binades correctly (the binade below a power of two has half the spacing).
    mag_up = (ints + step).view(r.dtype)
    mag_down = (ints - step).view(r.dtype)
    upper = torch.where(negative, mag_down, mag_up)
    lower = torch.where(negative, mag_up, mag_down)
    if r.dtype == torch.float64:
        # At and below 2^-126 the grid is uniform with spacing q, which float64 represents exactly.
        q = 2.0 ** (-126 - m)
        small = r.abs() <= _MIN_NORMAL
        upper = torch.where(small, r + q, upper)
        lower = torch.where(small, r - q, lower)
    else:
        # FP32 bits of +-0: moving "down" in magnitude from zero is meaningless, so handle zero apart.
        q = 2.0 ** (-126 - m)
        zero = r == 0
        upper = torch.where(zero, torch.full_like(r, q), upper)
        lower = torch.where(zero, torch.full_like(r, -q), lower)
    limit = grid_max(bits)
    inf = torch.full_like(r, float("inf"))
    upper = torch.where(upper > limit, inf, upper)
    lower = torch.where(lower < -limit, -inf, lower)
    return lower, upper


def rev(x: torch.Tensor, up: torch.Tensor, bits: int) -> torch.Tensor:
    """The neighbouring grid value of grid values x: toward +inf where `up`, toward -inf elsewhere.

    Raises GridOverflowError when a step would leave the grid (beyond the largest grid value).
    """
    lower, upper = neighbours(x, bits)
    out = torch.where(torch.as_tensor(up, dtype=torch.bool, device=x.device), upper, lower)
    if out.numel() and not bool(torch.isfinite(out).all()):
        raise GridOverflowError(f"rev steps beyond the largest grid value {grid_max(bits)!r} (bits={bits})")
    return out
