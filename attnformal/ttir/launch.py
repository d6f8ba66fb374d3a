"""Launch descriptions: which kernel argument is which tensor, length or table, and what the grid is.

A description is what the host promises the kernel, not what the kernel does: logical layouts
(each tensor's dimensions, contiguous row-major), the size each integer argument carries, the grid
and what each program is for, the contents of the host's tables (as predicates, written with the
spec's own functions), and the compile-time configurations. The theorems hold the IR to it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

import z3

from attnformal.masks import CAUSAL_MODES, MaskGeometry, key_interval, may_attend
from attnformal.merge import SoftmaxState, block_state, merge
from attnformal.schedule import FULL, PARTIAL, SKIP
from attnformal.spec import kv_head_of
from attnformal.tile import score_grads, softcap_slope
from attnformal.ttir.folding import LN2, Trees

INT32_MAX = 2 ** 31 - 1
KERNEL_FILE_ENV = "ATTNFORMAL_KERNEL_FILE"  # the kernel file a host entry point (LaunchDescription.entry) launches
MAX_ELEMENTS = 2 ** 40  # more elements than any accelerator's memory holds: every tensor a kernel accesses has fewer


@dataclass
class TensorRole:
    """A tensor argument: its logical dimensions (size names) and the roles of its axes.

    ``program`` names, per axis, the program coordinate that axis must equal (``"b"``, ``"h"``,
    ``"kv_head"``, ``"split"``); ``seq`` is the sequence axis, tiled as ``tile`` says (``"query"``: rows
    ``bm * BLOCK_M + lane``; ``"key"``: rows ``bn * BLOCK_N + lane`` of the key loop's iteration ``bn``);
    ``feature`` the axis indexed by the tile's last lane dimension. A tensor over (query, key) pairs has its
    ``columns`` axis indexed by the key tile (keys ``bn * BLOCK_N + lane``) and says in ``pairs`` what it holds:
    ``"mask"`` (a pair's score enters only where its element is nonzero), ``"keep"`` (dropout's keep flags),
    ``"bias"`` (added to the pair's score). ``strides``: per axis, the size (a name) or the constant its index is
    multiplied by (None: contiguous, row-major). ``lanes``: the tile dimensions that index the sequence and the
    feature axes (a K tile loaded as ``[D, BLOCK_N]``, transposed: ``(1, 0)``). A *table* has
    ``contract(index, value, sizes, config, context)``: what its entries hold.
    """

    dims: tuple[str, ...]
    program: dict[int, str] = field(default_factory=dict)
    seq: int | None = None
    feature: int | None = None
    tile: str | None = None
    output: bool = False
    contract: Callable | None = None
    strides: tuple | None = None
    columns: int | None = None
    pairs: str | None = None
    lanes: tuple[int, int] = (0, -1)


@dataclass(frozen=True)
class Fold:
    """What a key loop carries and how one tile updates it, written with the spec's own functions (the merge
    theorem holds the IR's update to ``update``, op for op)."""

    carried: tuple[str, ...]  # the loop's carried values (in order, unless ``stored`` names them)
    unit: tuple[float, ...]  # what they start from
    update: Callable  # (state: a tile per carried value, theorems.LoopTiles, config) -> the spec's next state
    says: str  # the update, for the report
    scores: str = "row max"  # where the tile's scores s are read: the loop's "row max", or its "exp" (of s - shift)
    # The tensor each carried value is stored to, where it is stored as it is (converted at most): the value is
    # then the loop result that store writes, whatever the order a front end gives the loop's iter_args.
    stored: tuple[str, ...] = ()
    # What the carried values stand for, as the spec's SoftmaxState (a base-2 fold: m in units of log2 e): then
    # ``update`` takes and gives spec states, and the theorem is that the kernel's next state means the spec's
    # next state (the same out and lse) in real arithmetic, not op for op.
    means: Callable | None = None


@dataclass
class LaunchDescription:
    kernel: str  # "module:attribute" of the @triton.jit function
    sizes: tuple[str, ...]
    arguments: dict[str, str]  # integer parameter -> size name
    tensors: dict[str, TensorRole]
    configs: list[dict]  # constexpr assignments to compile, each proven
    grid: Callable  # (sizes, config) -> grid extents (x, y, z)
    program: Callable  # (sizes, config, pids, fresh) -> (coordinates dict, defining facts)
    constraints: Callable  # (sizes, config) -> Z3 facts every launch satisfies
    preconditions: Callable  # (sizes, config) -> (name, fact) the host must ensure; reported as assumed
    geometry: Callable  # (sizes, config) -> MaskGeometry on Z3 terms (the spec's index mask)
    key_loop: tuple[str, tuple[str, ...]] | None  # (table, program coordinates): the key loop runs over
    # table[coordinates..., 0] <= block < table[coordinates..., 1]; None: over the blocks of the keys the spec allows
    block: Callable  # config -> (rows per query block, keys per key block)
    pointer_types: dict = field(default_factory=dict)  # parameter -> Triton type ("*i32", "fp32") where not the
    # default (*fp32 for an upper-case name, else i32)
    table_indices: Callable = lambda program, iv: {}  # (program coordinates, key loop iv or None) -> the
    # entries each table is read at: {table: [index, ...]} (where its contract is instantiated)
    in_loop: Callable | None = None  # (sizes, config, program, the innermost loop around an access) -> the
    # coordinates an iteration stands for (None: key block bn = iv / key_step)
    key_step: Callable = lambda config: 1  # config -> what the key loop's induction variable advances per key block
    outer_loop: Callable | None = None  # sizes -> (lower, upper): the range a loop around the block loop must run
    # The protocol entry point that launches the kernel, where a refutation's case replays: a name in the kernel's
    # module, or ``module:attr`` of a host outside it (a third-party file without one), told the kernel's file by
    # the environment variable KERNEL_FILE_ENV.
    entry: str = ""
    dtype: str = "float32"  # what the entry point is called with in a replay (the kernel's own input dtype)
    backward: bool = False  # the entry point launches it for gradients (a replay compares them too)
    fold: Fold | None = None  # what the key loop carries and how a tile updates it (the merge theorem; None: the
    # launch states none, reported as unknown)
    positive: frozenset = frozenset()  # float parameters the host passes positive (the softmax scale)
    cases: Callable | None = None  # (sizes, config) -> [(name, fact)]: alternatives one of which every launch meets
    # Tensors a program reads back right after storing to them (flash_attn_triton's TMP, a compiler-bug
    # workaround): the merge reads such a load as the value stored (assumed, and reported so).
    scratch: frozenset = frozenset()
    # (an output's dense stride orders); a writes theorem is decided in each (one nonlinear disjunction is slow)


def _cdiv(a, b):
    return (a + b - 1) / b  # Z3 Int division of non-negatives is floor


def _fwd_grid(s, config):
    return (s["nM"], s["S"], s["B"] * s["Hq"])


def _fwd_program(s, config, pids, fresh):
    """Axis x: query block ``bm``; y: split part; z: ``b * Hq + h`` (so ``b, h = divmod(z, Hq)``)."""
    b, h = pids[2] / s["Hq"], pids[2] % s["Hq"]
    facts = [s["Hq"] / s["Hkv"] == s["G"], s["Hq"] / s["G"] == s["Hkv"],  # true as Hq = G * Hkv
             b < s["B"], 0 <= h, h < s["Hq"]]  # true as 0 <= z < B * Hq
    return {"bm": pids[0], "split": pids[1], "b": b, "h": h, "kv_head": kv_head_of(h, s["Hq"], s["Hkv"])}, facts


def _fwd_constraints(s, config):
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    facts = [s[n] >= 1 for n in ("B", "Hq", "G", "Hkv", "Sq", "Sk", "D", "Dv", "S")]
    facts += [s[n] <= INT32_MAX for n in s]  # every length travels as an i32 argument
    facts += [s["Hq"] == s["G"] * s["Hkv"], s["D"] <= config["BLOCK_D"], s["Dv"] <= config["BLOCK_DV"],
              s["nM"] == _cdiv(s["Sq"], bm), s["nN"] == _cdiv(s["Sk"], bn),
              s["B"] * s["Hq"] <= 65535, s["S"] <= 65535,  # CUDA's grid z and y limits
              s["nM"] * bm <= INT32_MAX, s["nN"] * bn <= INT32_MAX]  # check_launchable: padded lengths < 2**31
    return facts + [s[n] >= 0 for n in _FLAG_STRIDES]  # a bool mask's strides (0: broadcast), as _flags_args passes


def _fwd_preconditions(s, config):
    """Nothing beyond what the host admits (the constraints): the kernel's i32 arithmetic is in range."""
    return []


def _geometry(s, config):
    return MaskGeometry(s["Sq"], s["Sk"], CAUSAL_MODES[config["CAUSAL"]], has_attn_mask=config["HAS_ATTN_MASK"])


def _row_end(which):
    def contract(index, value, s, config, context):
        b, i = index
        lo, hi = key_interval(i, _geometry(s, config))
        end = z3.If(lo < 0, 0, z3.If(lo > s["Sk"], s["Sk"], lo)) if which == 0 else \
            z3.If(hi < -1, -1, z3.If(hi > s["Sk"] - 1, s["Sk"] - 1, hi))
        return value == end  # the host's _row_interval_tables: key_interval, clamped to the keys that exist
    return contract


def _classes(index, value, s, config, context):
    """Class table entries; FULL only when every (unclipped) pair of the tile may attend, and never with mask data
    (obligation 5, tile classification, proves ``schedule.tile_class`` sound: (b) with an attn_mask no tile is FULL)."""
    b, bm, bn = index
    facts = [z3.Or(value == SKIP, value == PARTIAL, value == FULL)]
    if _geometry(s, config).has_attn_mask:
        facts.append(value != FULL)
    if "i" in context:
        block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
        i, j = context["i"], context["j"]
        inside = z3.And(bm * block_m <= i, i < bm * block_m + block_m, bn * block_n <= j, j < bn * block_n + block_n)
        facts.append(z3.Implies(z3.And(value == FULL, inside, b == context["b"]),
                                may_attend(i, j, _geometry(s, config))))
    return z3.And(facts)


def _reads(table, coordinates, tile):
    """The table entries a program reads: both ends of its range ``table[coordinates..., 0:2]`` and, in the loop,
    the class of its tile (``tile(program, iv)``: ``(b, bm, bn)``)."""
    def at(program, iv):
        index = tuple(program[name] for name in coordinates)
        entries = {table: [(*index, 0), (*index, 1)]}
        if iv is not None:
            entries["CLASSES"] = [tile(program, iv)]
        return entries
    return at


def _key_tile(program, iv):
    return program["b"], program["bm"], iv


def _pointers(*tables):
    """Pointer types other than the default fp32: the int32 tables, the int8 data masks."""
    return {name: "*i32" for name in ("ROW_LO", "ROW_HI", "CLASSES", *tables)} | {"ATTN_MASK": "*i8", "KEEP": "*i8"}


def _splits(index, value, s, config, context):
    """Split ranges lie within the key blocks (obligation 11: they partition the visited range)."""
    return z3.And(0 <= value, value <= s["nN"])


def _state(*extra):
    return TensorRole(("S", "B", "Hq", "Sq", *extra), program={0: "split", 1: "b", 2: "h"}, seq=3,
                      feature=4 if extra else None, tile="query", output=True)


def _query_rows(*extra, output=False):
    """A ``[B, Hq, Sq(, extra)]`` tensor read or written by a query block's program."""
    return TensorRole(("B", "Hq", "Sq", *extra), program={0: "b", 1: "h"}, seq=2, feature=3 if extra else None,
                      tile="query", output=output)


def _pairs(holds, strides=None):
    """A ``[B, Hq, Sq, Sk]`` tensor over (query, key) pairs: its rows the query tile's, its columns the key tile's."""
    return TensorRole(("B", "Hq", "Sq", "Sk"), program={0: "b", 1: "h"}, seq=2, columns=3, tile="query", pairs=holds,
                      strides=strides)


_FLAG_STRIDES = tuple(f"{mask}_s{axis}" for mask in ("mask", "keep") for axis in "bhij")
# The data masks: int8 views of bool masks with the strides the host passes (any, 0 to broadcast); the score bias
# contiguous in the state dtype.
_DATA = dict(ATTN_MASK=_pairs("mask", _FLAG_STRIDES[:4]), KEEP=_pairs("keep", _FLAG_STRIDES[4:]), BIAS=_pairs("bias"))


def _blocks(config):
    return config["BLOCK_M"], config["BLOCK_N"]


_INDEX_TABLES = dict(  # the row tables are read a query block at a time: their loads have an address theorem
    ROW_LO=TensorRole(("B", "Sq"), program={0: "b"}, seq=1, tile="query", contract=_row_end(0)),
    ROW_HI=TensorRole(("B", "Sq"), program={0: "b"}, seq=1, tile="query", contract=_row_end(1)),
    CLASSES=TensorRole(("B", "nM", "nN"), contract=_classes),
    SCALARS=TensorRole(("3",)),
)

# Each feature is its own `if HAS_X:` block of the kernels: all off (above, with and without the softcap) and all on
# reach every block.
_EVERY_FEATURE = dict(HAS_ATTN_MASK=True, HAS_KEEP=True, HAS_SOFTCAP=True, HAS_BIAS=True)
_FWD_BASE = dict(HAS_ATTN_MASK=False, HAS_KEEP=False, HAS_SOFTCAP=False, HAS_BIAS=False,
                 BLOCK_M=128, BLOCK_N=64, BLOCK_D=64, BLOCK_DV=64, BF16_VIA_FP32=False)

FORWARD = LaunchDescription(
    kernel="attnformal.kernels.triton_flash:_attn_fwd",
    entry="attention", backward=False,
    sizes=("B", "Hq", "G", "Hkv", "Sq", "Sk", "D", "Dv", "S", "nM", "nN", *_FLAG_STRIDES),
    arguments=dict(batch="B", heads_q="Hq", group="G", seq_q="Sq", seq_k="Sk", head_dim="D", head_dim_v="Dv",
                   num_q_blocks="nM", num_kv_blocks="nN", num_splits="S", **{name: name for name in _FLAG_STRIDES}),
    tensors=dict(
        Q=_query_rows("D"),
        K=TensorRole(("B", "Hkv", "Sk", "D"), program={0: "b", 1: "kv_head"}, seq=2, feature=3, tile="key"),
        V=TensorRole(("B", "Hkv", "Sk", "Dv"), program={0: "b", 1: "kv_head"}, seq=2, feature=3, tile="key"),
        M_PART=_state(), L_PART=_state(), ACC_PART=_state("Dv"),
        **_INDEX_TABLES, **_DATA, KV_SPLITS=TensorRole(("B", "nM", "S", "2"), contract=_splits),
    ),
    configs=[dict(_FWD_BASE, CAUSAL=mode, HAS_SOFTCAP=softcap) for softcap in (False, True)
             for mode in range(len(CAUSAL_MODES))]
    + [dict(_FWD_BASE, CAUSAL=mode, **_EVERY_FEATURE) for mode in range(len(CAUSAL_MODES))],
    grid=_fwd_grid, program=_fwd_program, constraints=_fwd_constraints, preconditions=_fwd_preconditions,
    geometry=_geometry, key_loop=("KV_SPLITS", ("b", "bm", "split")), block=_blocks,
    pointer_types=_pointers("KV_SPLITS"), table_indices=_reads("KV_SPLITS", ("b", "bm", "split"), _key_tile),
    fold=Fold(("m", "l", "acc"), (-math.inf, 0.0, 0.0),
              lambda state, tiles, config: merge(SoftmaxState(*state),
                                                 block_state(tiles.s, tiles["V"], _keep_weights(tiles, config))),
              "merge(state, block_state(s, V, weights))"),
)


def _keep_weights(tiles, config):
    """The dropout weights of a tile where the kernel replays a keep mask (else None): SCALARS[2] = 1 / (1 - p)
    where KEEP holds the pair, 0 where it does not."""
    return tiles.where_pairs("keep", tiles.element("SCALARS", 2), 0.0) if config["HAS_KEEP"] else None


def _tile_grads(tiles, config):
    """The spec's gradients of a tile (:func:`~attnformal.tile.score_grads`) from the kernel's scores: SCALARS holds
    ``(scale, softcap, 1 / (1 - p))``; the softcap's slope is the spec's, of the scores before their mask."""
    slope = softcap_slope(tiles.capped, tiles.element("SCALARS", 1)) if config["HAS_SOFTCAP"] else None
    return score_grads(tiles.s, slope, tiles["Q"], tiles["K"], tiles["V"], tiles["DO"], tiles["LSE"], tiles["DELTA"],
                       scale=tiles.element("SCALARS", 0), weights=_keep_weights(tiles, config))


def _dq_grid(s, config):
    return (s["nM"], s["B"] * s["Hq"], 1)


def _dq_program(s, config, pids, fresh):
    """Axis x: query block ``bm``; y: ``b * Hq + h``."""
    coordinates, facts = _fwd_program(s, config, [pids[0], 0, pids[1]], fresh)
    return {name: value for name, value in coordinates.items() if name != "split"}, facts


def _dq_constraints(s, config):
    """The forward's shapes with one split part (dQ visits a query block's whole key range)."""
    return _fwd_constraints(dict(s, S=z3.IntVal(1)), config)


# dQ of one query block of one query head (FlashAttention-2's second backward kernel): the forward's
# key loop without split parts, over the host's kv_ranges (obligation 12: the schedule's kv_range).
BACKWARD_DQ = LaunchDescription(
    kernel="attnformal.kernels.triton_flash:_attn_bwd_dq",
    entry="attention", backward=True,
    sizes=("B", "Hq", "G", "Hkv", "Sq", "Sk", "D", "Dv", "nM", "nN", *_FLAG_STRIDES),
    arguments=dict(batch="B", heads_q="Hq", group="G", seq_q="Sq", seq_k="Sk", head_dim="D", head_dim_v="Dv",
                   num_q_blocks="nM", num_kv_blocks="nN", **{name: name for name in _FLAG_STRIDES}),
    tensors=dict(
        Q=_query_rows("D"), DO=_query_rows("Dv"), LSE=_query_rows(), DELTA=_query_rows(),
        K=FORWARD.tensors["K"], V=FORWARD.tensors["V"], DQ=_query_rows("D", output=True),
        KV_RANGES=TensorRole(("B", "nM", "2"), contract=_splits), **_INDEX_TABLES, **_DATA,
        DBIAS=_pairs(None),  # dS of the visited tiles: addresses and bounds (its SKIP tiles stay the host's zeros)
    ),
    configs=FORWARD.configs,
    grid=_dq_grid, program=_dq_program, constraints=_dq_constraints, preconditions=_fwd_preconditions,
    geometry=_geometry, key_loop=("KV_RANGES", ("b", "bm")), block=_blocks,
    pointer_types=_pointers("KV_RANGES"), table_indices=_reads("KV_RANGES", ("b", "bm"), _key_tile),
    fold=Fold(("dq",), (0.0,), lambda state, tiles, config: (state[0] + _tile_grads(tiles, config)[0],),
              "state + score_grads(s, slope, Q, K, V, DO, LSE, DELTA, scale, weights)", scores="exp", stored=("DQ",)),
)


def _dkdv_grid(s, config):
    return (s["nN"], s["B"] * s["Hkv"], 1)


def _dkdv_program(s, config, pids, fresh):
    """Axis x: key block ``bn``; y: ``b * Hkv + kv_head``."""
    facts = [s["Hq"] / s["G"] == s["Hkv"]]  # true as Hq = G * Hkv: the kernel's heads_kv
    return {"bn": pids[0], "b": pids[1] / s["Hkv"], "kv_head": pids[1] % s["Hkv"]}, facts


def _dkdv_in_loop(s, config, program, loop):
    """The outer loop runs over the query heads of the group (iteration ``g``: head ``kv_head * G + g``, the
    heads ``kv_head_of`` maps to ``kv_head``, obligation 6); the inner one over query blocks ``bm``."""
    head_loop = loop if loop.outer is None else loop.outer
    inside = {"h": program["kv_head"] * s["G"] + head_loop.iv}
    return inside if loop.outer is None else {**inside, "bm": loop.iv}


def _query_blocks(index, value, s, config, context):
    """Query-block ranges lie within the query blocks (obligation 12 (b): the non-SKIP blocks of each key block)."""
    return z3.And(0 <= value, value <= s["nM"])


def _key_rows(feature, output=False):
    return TensorRole(("B", "Hkv", "Sk", feature), program={0: "b", 1: "kv_head"}, seq=2, feature=3, tile="key",
                      output=output)


# dK, dV of one key block of one KV head (FlashAttention-2's first backward kernel): a loop over the query heads
# of its group around a loop over the host's q_ranges, the query blocks whose tile with it is not SKIP.
BACKWARD_DKDV = LaunchDescription(
    kernel="attnformal.kernels.triton_flash:_attn_bwd_dkdv",
    entry="attention", backward=True,
    sizes=BACKWARD_DQ.sizes, arguments=BACKWARD_DQ.arguments,
    tensors=dict(
        Q=_query_rows("D"), DO=_query_rows("Dv"), LSE=_query_rows(), DELTA=_query_rows(),
        K=_key_rows("D"), V=_key_rows("Dv"), DK=_key_rows("D", output=True), DV=_key_rows("Dv", output=True),
        Q_RANGES=TensorRole(("B", "nN", "2"), contract=_query_blocks), **_INDEX_TABLES, **_DATA,
    ),
    configs=FORWARD.configs,
    grid=_dkdv_grid, program=_dkdv_program, constraints=_dq_constraints, preconditions=_fwd_preconditions,
    geometry=_geometry, key_loop=("Q_RANGES", ("b", "bn")), block=_blocks,
    pointer_types=_pointers("Q_RANGES"), in_loop=_dkdv_in_loop, outer_loop=lambda s: (0, s["G"]),
    table_indices=_reads("Q_RANGES", ("b", "bn"), lambda program, iv: (program["b"], iv, program["bn"])),
    fold=Fold(("dk", "dv"), (0.0, 0.0), lambda state, tiles, config: tuple(
        x + dx for x, dx in zip(state, _tile_grads(tiles, config)[1:3])),
        "state + score_grads(s, slope, Q, K, V, DO, LSE, DELTA, scale, weights)", scores="exp", stored=("DK", "DV")),
)


# ------------------------------------------------------------------------ third-party kernels (docs/ttir.md)

def _flash_constraints(s, config):
    """``_flash_attn_forward``'s launch: q, k, v ``[B, S, H, D]`` with any strides and ``stride(-1) == 1``
    (``FlashAttnFunc`` makes it so), out ``empty_like(q)`` (dense: row-major over some order of its first three
    axes), lse and the scratch TMP ``[B, H, SqR]`` contiguous; EVEN_M, EVEN_N, EVEN_HEADDIM as its heuristics."""
    lengths = [s[n] for n in ("B", "Hq", "Sq", "Sk", "D")]
    strides = [s[n] for n in s if n.startswith("stride")]
    block_m, block_n, block_d = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_HEADDIM"]
    facts = [n >= 1 for n in lengths] + [t >= 0 for t in strides] + [s[n] <= INT32_MAX for n in s]
    facts += [s["Hkv"] == s["Hq"], s["Dv"] == s["D"], s["SqR"] == _cdiv(s["Sq"], 128) * 128,
              s["B"] * s["Hq"] <= 65535,  # CUDA's grid y limit
              (s["Sq"] % block_m == 0) == config["EVEN_M"], (s["Sk"] % block_n == 0) == config["EVEN_N"],
              (s["D"] == block_d) == config["EVEN_HEADDIM"], block_d / 2 < s["D"], s["D"] <= block_d]
    return facts + [z3.Or([fact for _, fact in _flash_out_orders(s)])]


def _flash_out_orders(s, config=None):
    """``empty_like(q)``'s strides: row-major over one order of (B, Sq, H), the head dim innermost; one case each."""
    axes = [("stride_ob", "B"), ("stride_om", "Sq"), ("stride_oh", "H")]
    cases = []
    for order in itertools.permutations(axes):  # innermost first, after the head dim
        extent, each = s["D"], []
        for stride, n in order:
            each.append(s[stride] == extent)
            extent = extent * s["Hq" if n == "H" else n]
        cases.append((f"out row-major over ({', '.join(n for _, n in reversed(order))}, D)", z3.And(each)))
    return cases


def _flash_program(s, config, pids, fresh):
    """Axis x: query block ``start_m``; y: ``off_hb = b * nheads + h``; one KV head per query head."""
    b, h = pids[1] / s["Hq"], pids[1] % s["Hq"]
    return {"bm": pids[0], "b": b, "h": h, "kv_head": h}, []


def _flash_rows(dims, strides, tile, output=False):
    return TensorRole(dims, program={0: "b", 2: "h"}, seq=1, feature=3, tile=tile, output=output, strides=strides)


def _flash_row_table():
    return TensorRole(("B", "Hq", "SqR"), program={0: "b", 1: "h"}, seq=2, tile="query", output=True)


_FLASH_STRIDES = tuple(f"stride_{t}{a}" for t, row in (("q", "m"), ("k", "n"), ("v", "n"), ("o", "m")) for a in "bh" + row)


def _flash_attn_triton(causal):
    """flash_attn_triton's ``_fwd_kernel`` (examples/flash_attn_triton.py) as ``_flash_attn_forward`` launches it,
    its ``IS_CAUSAL`` read as the causal mode ``causal``."""
    rows = ("B", "Sq", "Hq", "D")
    return LaunchDescription(
        kernel="examples.flash_attn_triton:_fwd_kernel", entry="attention",
        sizes=("B", "Hq", "Hkv", "Sq", "Sk", "D", "Dv", "SqR", *_FLASH_STRIDES),
        arguments=dict(nheads="Hq", seqlen_q="Sq", seqlen_k="Sk", seqlen_q_rounded="SqR", headdim="D",
                       **{name: name for name in _FLASH_STRIDES}),
        tensors=dict(Q=_flash_rows(rows, ("stride_qb", "stride_qm", "stride_qh", 1), "query"),
                     K=_flash_rows(("B", "Sk", "Hkv", "D"), ("stride_kb", "stride_kn", "stride_kh", 1), "key"),
                     V=_flash_rows(("B", "Sk", "Hkv", "D"), ("stride_vb", "stride_vn", "stride_vh", 1), "key"),
                     Out=_flash_rows(rows, ("stride_ob", "stride_om", "stride_oh", 1), "query", output=True),
                     Lse=_flash_row_table(), TMP=_flash_row_table()),  # TMP: a scratch row per program, raced on if shared
        configs=[dict(BIAS_TYPE="none", IS_CAUSAL=is_causal, BLOCK_HEADDIM=64, EVEN_M=even_m, EVEN_N=even_n,
                      EVEN_HEADDIM=even_d, BLOCK_M=128, BLOCK_N=128)  # _flash_attn_forward's BLOCK, head dims 33-64
                 for is_causal in (False, True) for even_m in (False, True) for even_n in (False, True)
                 for even_d in (False, True)],
        grid=lambda s, config: (_cdiv(s["Sq"], config["BLOCK_M"]), s["B"] * s["Hq"], 1), program=_flash_program,
        constraints=_flash_constraints, preconditions=_fwd_preconditions,
        geometry=lambda s, config: MaskGeometry(s["Sq"], s["Sk"], causal if config["IS_CAUSAL"] else None),
        key_loop=None, key_step=lambda config: config["BLOCK_N"], block=lambda config: (config["BLOCK_M"],
                                                                                         config["BLOCK_N"]),
        pointer_types={"Bias": "*fp32", "Out": "*fp32", "Lse": "*fp32", "softmax_scale": "fp32",
                       "CACHE_KEY_SEQLEN_Q": "i32", "CACHE_KEY_SEQLEN_K": "i32"},
        positive=frozenset({"softmax_scale"}), cases=_flash_out_orders, scratch=frozenset({"TMP"}),
        # (acc_o, lse_i, m_i): acc_o is relative to m_i, lse_i the log-sum-exp so far, so l = exp(lse - m)
        fold=Fold(("acc", "lse", "m"), (0.0, -math.inf, -math.inf),
                  lambda state, tiles, config: merge(state, block_state(tiles.s, tiles["V"])),
                  "merge(state, block_state(s, V))", scores="exp",
                  means=lambda acc, lse, m: SoftmaxState(m, Trees.exp(lse - m), acc)),
    )


# flash_attn_func's causal=True is bottom-right (FlashAttention >= 2.1): what the kernel is held to. The kernel's own
# alignment, top-left, is FLASH_ATTN_TRITON_TOP_LEFT (tests/ttir/test_third_party.py proves it).
FLASH_ATTN_TRITON = _flash_attn_triton("bottom_right")
FLASH_ATTN_TRITON_TOP_LEFT = _flash_attn_triton("top_left")


_TUTORIAL_STRIDES = tuple(f"stride_{t}{a}" for t, row, col in (("q", "m", "k"), ("k", "n", "k"), ("v", "k", "n"),
                                                               ("o", "m", "n")) for a in ("z", "h", row, col))


def _tutorial_constraints(contiguous):
    def constraints(s, config):
        """``_attention.forward``'s launch of ``_attn_fwd``: q, k, v ``[Z, H, N_CTX, HEAD_DIM]`` with any strides (it
        passes each tensor's own four; ``contiguous``: row-major, as its tests make them), one ``N_CTX`` for queries
        and keys, ``HEAD_DIM`` the constexpr; o = ``empty_like(q)`` and M ``[Z, H, N_CTX]`` float32, both contiguous
        (as for a contiguous q: other layouts of o are not described)."""
        lengths = [s[n] for n in ("B", "Hq", "Sq", "Sk", "D")]
        facts = [n >= 1 for n in lengths] + [s[t] >= 0 for t in _TUTORIAL_STRIDES] + [s[n] <= INT32_MAX for n in s]
        row_major = [s["Hq"] * s["Sq"] * s["D"], s["Sq"] * s["D"], s["D"], 1]
        dense = "qkvo" if contiguous else "o"
        return facts + [s["Sk"] == s["Sq"], s["Hkv"] == s["Hq"], s["D"] == config["HEAD_DIM"], s["Dv"] == s["D"],
                        s["B"] * s["Hq"] <= 65535] + [s[name] == row_major[k % 4] for k, name in
                                                      enumerate(_TUTORIAL_STRIDES) if name[7] in dense]
    return constraints


def _tutorial_preconditions(s, config):
    """The tutorial loads whole blocks with no boundary check (its tests and benchmarks use N_CTX = 1024 .. 16384)."""
    return [("N_CTX is a multiple of BLOCK_M (the tutorial's tests; its host does not check)",
             s["Sq"] % config["BLOCK_M"] == 0)]


def _tutorial_program(s, config, pids, fresh):
    """Axis x: query block; y: ``off_hz = z * H + h``."""
    return {"bm": pids[0], "b": pids[1] / s["Hq"], "h": pids[1] % s["Hq"], "kv_head": pids[1] % s["Hq"]}, []


def _tutorial_rows(tile, strided="", lanes=(0, -1), output=False):
    """A ``[Z, H, N_CTX, HEAD_DIM]`` tensor; ``strided``: the tensor letter of its four stride arguments (else
    contiguous)."""
    strides = tuple(name for name in _TUTORIAL_STRIDES if name.startswith(f"stride_{strided}")) if strided else None
    return TensorRole(("B", "Hq", "Sq" if tile == "query" else "Sk", "D"), program={0: "b", 1: "h"}, seq=2, feature=3,
                      tile=tile, output=output, strides=strides, lanes=lanes)


_TUTORIAL_M = TensorRole(("B", "Hq", "Sq"), program={0: "b", 1: "h"}, seq=2, tile="query", output=True)


def _tutorial_fold(values):
    """The tutorial's base-2 fold: ``(acc, l, m)`` with ``m`` and the scores ``s`` it takes ``exp2`` of in units of
    log2 e, so they stand for the spec's ``(m ln 2, l, acc)`` and scores ``s ln 2``; ``values``: the V tensor."""
    return Fold(("acc", "l", "m"), (0.0, 0.0, -math.inf),
                lambda state, tiles, config: merge(state, block_state(tiles.s * LN2, tiles[values])),
                "merge(state, block_state(s ln 2, V))", scores="exp",
                means=lambda acc, l, m: SoftmaxState(m * LN2, l, acc))


def _triton_tutorial(contiguous):
    """The Triton tutorial's fused attention, block-pointer forward (``python/tutorials/06-fused-attention.py`` of
    triton-lang/triton at 003da478d84f5bb0f51b3988cf0ea0bbe60282b7: ``_attn_fwd``, ``_attn_fwd_inner``), as its host
    ``_attention.forward`` launches it. Not vendored: ``--triton`` is pointed at a copy of the file (docs/ttir.md).
    Block pointers are gone from later Triton, so it lowers with triton-ascend's front end (``--triton-target
    ascend``)."""
    return LaunchDescription(
        kernel="06-fused-attention:_attn_fwd", entry="",
        sizes=("B", "Hq", "Hkv", "Sq", "Sk", "D", "Dv", *_TUTORIAL_STRIDES),
        arguments=dict(Z="B", H="Hq", N_CTX="Sq", **{name: name for name in _TUTORIAL_STRIDES}),
        tensors=dict(Q=_tutorial_rows("query", "q"), K=_tutorial_rows("key", "k", lanes=(1, 0)),
                     V=_tutorial_rows("key", "v"), Out=_tutorial_rows("query", output=True), M=_TUTORIAL_M),
        configs=[dict(HEAD_DIM=64, BLOCK_M=128, BLOCK_N=64, CAUSAL=causal) for causal in (False, True)],
        grid=lambda s, config: (_cdiv(s["Sq"], config["BLOCK_M"]), s["B"] * s["Hq"], 1),
        program=_tutorial_program,
        constraints=_tutorial_constraints(contiguous), preconditions=_tutorial_preconditions,
        geometry=lambda s, config: MaskGeometry(s["Sq"], s["Sk"], "top_left" if config["CAUSAL"] else None),
        key_loop=None, key_step=lambda config: config["BLOCK_N"], block=_blocks,
        pointer_types={"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "M": "*fp32", "sm_scale": "fp32",
                       "Z": "i32", "H": "i32", "N_CTX": "i32"},
        positive=frozenset({"sm_scale"}), fold=_tutorial_fold("V"),
    )


TRITON_TUTORIAL = _triton_tutorial(contiguous=False)
TRITON_TUTORIAL_CONTIGUOUS = _triton_tutorial(contiguous=True)  # q, k, v as its tests make them

_DESCRIPTORS = ("desc_q", "desc_k", "desc_v", "desc_o")
# Each host TensorDescriptor reaches the kernel as its base pointer, shape and strides in i64, its padding and tf32
# flags, and the shape (i32) and strides again, as Triton prints them: desc_q.shape.0_0 ...
_FIELDS = ("shape.0", "shape.1", "stride.0", "stride.1")
_DESCRIPTOR_FIELDS = tuple(f"{d}.{field}" for d in _DESCRIPTORS for field in _FIELDS)
_DESCRIPTOR_COPIES = tuple(f"{name}_{k}" for k, name in enumerate(_DESCRIPTOR_FIELDS))


def _tutorial_tma_constraints(s, config):
    """``_attention.forward``'s TMA launch: each of q, k, v, o (contiguous ``[Z, H, N_CTX, HEAD_DIM]``, as its tests
    make them) behind a TensorDescriptor of shape ``[Z * H * N_CTX, HEAD_DIM]`` and strides ``[HEAD_DIM, 1]``."""
    facts = _tutorial_constraints(contiguous=True)(s, config)
    rows = s["B"] * s["Hq"] * s["Sq"]
    view = (rows, s["D"], s["D"], 1)  # shape.0, shape.1, stride.0, stride.1
    return facts + [s[name] == view[k % 4] for fields in (_DESCRIPTOR_FIELDS, _DESCRIPTOR_COPIES)
                    for k, name in enumerate(fields)]


# The tutorial's TMA forward (``_attn_fwd_tma``, ``_attn_fwd_inner_tma``, same file and commit): host tensor
# descriptors, which CUDA's ttir stage rewrites to pointer arithmetic below sm_90 (the IR proven here), and two
# stages under causal (STAGE 3: the off-band blocks unmasked, then the diagonal block masked).
TRITON_TUTORIAL_TMA = LaunchDescription(
    kernel="06-fused-attention:_attn_fwd_tma", entry="attnformal.examples.triton_tutorial:attention_tma",
    dtype="float16",
    sizes=("B", "Hq", "Hkv", "Sq", "Sk", "D", "Dv", *_TUTORIAL_STRIDES, *_DESCRIPTOR_FIELDS, *_DESCRIPTOR_COPIES),
    arguments=dict(Z="B", H="Hq", N_CTX="Sq", **{name: name for name in _DESCRIPTOR_FIELDS + _DESCRIPTOR_COPIES}),
    tensors=dict(desc_q=_tutorial_rows("query"), desc_k=_tutorial_rows("key"), desc_v=_tutorial_rows("key"),
                 desc_o=_tutorial_rows("query", output=True), M=_TUTORIAL_M),
    configs=[dict(HEAD_DIM=64, BLOCK_M=128, BLOCK_N=64, FP8_OUTPUT=False, STAGE=stage) for stage in (1, 3)],
    grid=TRITON_TUTORIAL.grid, program=TRITON_TUTORIAL.program,
    constraints=_tutorial_tma_constraints, preconditions=_tutorial_preconditions,
    geometry=lambda s, config: MaskGeometry(s["Sq"], s["Sk"], "top_left" if config["STAGE"] == 3 else None),
    key_loop=None, key_step=lambda config: config["BLOCK_N"], block=_blocks,
    pointer_types={"M": "*fp32", "sm_scale": "fp32", "Z": "i32", "H": "i32", "N_CTX": "i32",
                   **{d: f"tensordesc<fp16[{128 if d in ('desc_q', 'desc_o') else 64},64]>" for d in _DESCRIPTORS}},
    positive=frozenset({"sm_scale"}), fold=_tutorial_fold("desc_v"),
)
LAUNCHES = {launch.kernel: launch for launch in (FORWARD, BACKWARD_DQ, BACKWARD_DKDV, FLASH_ATTN_TRITON,
                                                 TRITON_TUTORIAL, TRITON_TUTORIAL_TMA)}
