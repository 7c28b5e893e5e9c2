"""Fixed-point formats of the integer (int8) forward pass, shared by the exporter, the host reference
(rp2040/reference.py, the spec) and the kernels. rp2040/FORMAT.md explains each choice.

Every value stays a 32-bit signed integer, so viper's machine words and MicroPython's small ints
(no heap object) hold it; the host reference checks that bound.
"""
ACT_FRAC = 16  # activations: value = int / 2**16 (residual stream, norms, linear outputs, GELU)
ACC_BOUND = 1 << 29  # |sum of n int8 * input| stays below this: inputs are shifted to n_in's limit
NORM_FRAC = 12  # LayerNorm's normalized values before the weight: int / 2**12
GAMMA_MAX = (1 << 14) - 1  # LayerNorm weights as int * 2**-S with |int| <= this
MULT_MAX = (1 << 15) - 1  # row multipliers of the int8 matrices: scale = M * 2**-S, |M| <= this
ROPE_FRAC = 14  # cos / sin tables
V_BITS = 14  # V cache rows: |int| < 2**14 with one shift per (layer, position)
LOGIT_FRAC = 10  # attention scores and temperature-scaled logits before exp: int / 2**10
EXP_FRAC = 15  # probabilities: int / 2**15, so the largest is exactly 2**15
EXP_STEPS = 64  # exp table: round(2**15 * 2**(-i/64)), i = 0..64 (tests recompute it)
EXP_TABLE = (
    32768, 32415, 32066, 31720, 31379, 31041, 30706, 30376, 30048, 29725, 29405, 29088, 28774, 28464, 28158,
    27855, 27554, 27258, 26964, 26674, 26386, 26102, 25821, 25543, 25268, 24995, 24726, 24460, 24196, 23936,
    23678, 23423, 23170, 22921, 22674, 22430, 22188, 21949, 21713, 21479, 21247, 21019, 20792, 20568, 20347,
    20127, 19911, 19696, 19484, 19274, 19066, 18861, 18658, 18457, 18258, 18061, 17867, 17674, 17484, 17296,
    17109, 16925, 16743, 16562, 16384)
LOG2E = 23637  # round(log2(e) * 2**14)
EXP_CUT = 15 << LOGIT_FRAC  # beyond 15 (in log2 units) a probability rounds to 0 at EXP_FRAC
GELU_LO = -4  # GELU table covers [-4, 4) in steps of 2**-6; beyond it GELU(x) = 0 or x
GELU_STEP_BITS = ACT_FRAC - 6
GELU_N = 8 * 64 + 1
INV_T_FRAC = 12  # sampling: 1/temperature as int / 2**12
# The constants block of an int8 model.bin, after the row multipliers (FORMAT.md): its first entries,
# then the GELU table and the rotary cos and sin tables.
C_FINAL_S, C_EMBED_S, C_HEAD_S, C_EPS, C_TABLES = 0, 1, 2, 3, 4


def bitlen(v):
    """Bits of a non-negative int (int.bit_length, which MicroPython lacks)."""
    n = 0
    while v:
        v >>= 1
        n += 1
    return n


def input_limit(n_in):
    """Largest |input| of an n_in-long int8 dot product that keeps the sum below ACC_BOUND."""
    return ACC_BOUND // (127 * n_in)


def norm_bits(d):
    """Centered values of a d-wide LayerNorm keep this many bits, so their d squares sum below 2**30."""
    return (30 - bitlen(d)) // 2


def qk_bits(head_dim):
    """Bits of the rotated q and cached k rows: a head_dim-long dot product stays below 2**29."""
    return (28 - bitlen(head_dim)) // 2


def isqrt(v):
    """floor(sqrt(v)) for 0 <= v < 2**30 (MicroPython's small ints)."""
    r, bit = 0, 1 << 28
    while bit > v:
        bit >>= 2
    while bit:
        if v >= r + bit:
            v -= r + bit
            r = (r >> 1) + bit
        else:
            r >>= 1
        bit >>= 2
    return r
