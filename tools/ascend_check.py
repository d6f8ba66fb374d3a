"""The triton-ascend lowering gate: every Triton kernel of attnformal, lowered for Ascend 910B.

    make ascend-check                                   # builds .venv-ascend, runs this, then its tests
    .venv-ascend/bin/python tools/ascend_check.py [--kernels PATH] [--config NAME ...] [--list]

For every configuration the project ships (the default schedule) and its kernel tests use
(``tests/kernels/test_triton_flash.py``: the feature matrix, the block-size and split-KV cases)
in float16, bfloat16 and float32, plus each padded head-dim class with and without causal masking,
it asks the launcher (``Launch.calls``) for the three kernel calls it would make, with the very
arguments it would pass, and lowers each through triton-ascend's first two stages for
``GPUTarget("npu", "Ascend910B3", 0)``:

* ``ttir``: triton-ascend's front end and TTIR passes (its dtype and ``tl.dot`` rules, e.g. no
  float64, no tf32);
* ``ttadapter``: ``triton-adapter-opt``, TTIR -> Linalg/HIVM;

and then checks that no CUDA-only construct survived (``llvm.inline_asm``, CUDA libdevice calls):
``triton-adapter-opt`` passes inline assembly through unchanged. The last stage, ``npubin``
(``bishengir-compile`` from the CANN toolkit: on-chip memory planning, the binary), is not run,
so this gate does not show that a kernel fits the unified buffer, nor that it runs.

A compiled variant is lowered once (Triton's own cache key: argument types, specialisations,
constexprs); configurations that share it share its result. One line per configuration, the
compiler's message under every failure, then the coverage the lowered variants reached, and
``ascend-check: N passed, M failed`` for the (configuration, kernel) pairs. Exit status 1 if
anything failed, a required class (see ``REQUIRED_COVERAGE``) was never lowered, or a
``@triton.jit`` function of the kernel module was in no lowered kernel.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import sys
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from attnformal.ttir.lower import DEVICES

ROOT = Path(__file__).resolve().parents[1]
TARGET = DEVICES["ascend"]  # the GPUTarget the TTIR prover lowers for too
DTYPES = ("float16", "bfloat16", "float32")  # Ascend has no float64: the launcher refuses it on an NPU
HEAD_DIMS = (16, 32, 64, 128, 256)  # one per padded head-dim class (triton-ascend: {16, ..., 256})
# Left by triton-adapter-opt in the Linalg module, but CUDA-only: bishengir cannot compile them.
CUDA_ONLY = {"llvm.inline_asm": "inline assembly", "@__nv_": "a CUDA libdevice function"}


class Config(NamedTuple):
    name: str
    inputs: tuple  # q, k, v
    kwargs: dict  # the implementation protocol's keyword arguments
    schedule: Any


class Outcome(NamedTuple):
    ok: bool
    detail: str  # "lowered ..." or the compiler's message
    helpers: frozenset = frozenset()  # the @triton.jit functions the kernel called


# ----------------------------------------------------------------------------------------
# The configurations: the tests' own cases, the shipped default schedule, each head-dim class
# ----------------------------------------------------------------------------------------

def kernel_test_cases():
    """``tests/kernels/test_triton_flash.py``: the kernel tests' cases and their input maker."""
    sys.path.insert(0, str(ROOT / "tests" / "kernels"))
    return importlib.import_module("test_triton_flash")


def configurations(kernels) -> list[Config]:
    import torch

    from attnformal.schedule import TileSchedule

    cases = kernel_test_cases()
    windowed, causal_blocks = cases.BLOCK_SIZE_CASES

    def config(name, seed, dtype, shape, kwargs, schedule):
        inputs = cases.make_inputs(seed, dtype=getattr(torch, dtype), **shape)[:3]
        label = f"{schedule.block_m}x{schedule.block_n}" + (f"/{schedule.num_splits}splits" if schedule.num_splits > 1
                                                             else "")
        return Config(f"{name}/{dtype}/{label}", inputs, kwargs, schedule)

    found = []
    for dtype in DTYPES:
        for schedule in (cases.SMALL, kernels.DEFAULT_SCHEDULE):
            found += [config(name, seed, dtype, shape, kwargs, schedule)
                      for seed, (name, shape, kwargs) in enumerate(cases.FEATURES)]
        for block_m in cases.ACCEPTED_BLOCKS:
            for block_n in cases.ACCEPTED_BLOCKS:
                found.append(config("blocks", 30, dtype, cases.BLOCK_SIZE_INPUTS, windowed,
                                    TileSchedule(block_m, block_n)))
                if block_m >= block_n:
                    found.append(config("blocks_causal", 30, dtype, cases.BLOCK_SIZE_INPUTS, causal_blocks,
                                        TileSchedule(block_m, block_n)))
        for splits in cases.SPLIT_KV_COUNTS:
            found.append(config("split_kv", 31, dtype, cases.SPLIT_KV_INPUTS, cases.SPLIT_KV_CASE,
                                TileSchedule(16, 16, splits)))
        for head_dim in HEAD_DIMS:
            for causal in (None, "bottom_right"):
                found.append(config(f"head_dim_{head_dim}" + ("_causal" if causal else ""), 50, dtype,
                                    {"len_q": 130, "len_k": 130, "head_dim": head_dim}, {"causal": causal},
                                    kernels.DEFAULT_SCHEDULE))
    return found


# ----------------------------------------------------------------------------------------
# Lowering one kernel call
# ----------------------------------------------------------------------------------------

class Lowerer:
    """Lowers JIT functions through triton-ascend's ``ttir`` and ``ttadapter`` stages, no device needed.

    ``JITFunction.run`` asks the NPU driver for its target, so this takes its first steps by
    hand: the binder gives the signature and specialisations exactly as for a launch (the
    steps of triton-ascend 3.2.0's ``triton/runtime/jit.py``, ``JITFunction.run``), then the
    backend's own stages run (``triton/backends/ascend/compiler.py``, ``AscendBackend.add_stages``).
    """

    def __init__(self):
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend

        self.target = GPUTarget(*TARGET)
        self.backend = make_backend(self.target)
        self.options = self.backend.parse_options({})
        self.stages = {}
        self.backend.add_stages(self.stages, self.options)

    def variant(self, kernel, args) -> tuple:
        """The compiled variant a launch with ``args`` would use, and its source for the compiler."""
        from triton.compiler.compiler import ASTSource

        if kernel.binder is None:
            kernel.create_binder(self.backend)
        bound, sig_and_spec, constexpr_vals, _, excess = kernel.binder(**args)
        names = [kernel.params[i].name for i in kernel.non_constexpr_indices]
        signature = {name: ("*i8" if kind == "none" else kind) for name, kind in zip(names, sig_and_spec)}
        values = tuple(bound.values())
        attrs = self.backend.get_attrs_descriptor(kernel.params, values)
        constant_params = attrs.get_constants()
        constants = {p.name: value for value, p in zip(values, kernel.params)
                     if p.is_constexpr or p.num in constant_params or value is None}
        key = (kernel.fn.__qualname__, "".join(sig_and_spec), str((constexpr_vals, excess)))
        return key, ASTSource(kernel, signature, constants, attrs)

    def submit(self, pool, source) -> Future:
        """The front end and ``ttir`` here (they hold the GIL), ``ttadapter`` (a subprocess) on ``pool``."""
        from triton._C.libtriton import ir

        context = ir.context()
        ir.load_dialects(context)
        self.backend.load_dialects(context)
        metadata = {"hash": "ascend-check", "target": self.target, **self.options.__dict__}
        stage = "front end"
        try:
            module = source.make_ir(self.options, self.backend.get_codegen_implementation(),
                                    self.backend.get_module_map(), context)
            helpers = frozenset(re.findall(r'tt\.func (?:public |private )?@"?(\w+?)__', str(module)))
            stage = "ttir"
            ttir = str(self.stages["ttir"](module, metadata))  # the next stage reads it as text
        except Exception as error:  # the compiler's own message is the report
            failure = Future()
            failure.set_result(_failure(stage, error))
            return failure
        return pool.submit(self._adapt, ttir, metadata, helpers)

    def _adapt(self, ttir: str, metadata: dict, helpers) -> Outcome:
        try:
            linalg = self.stages["ttadapter"](ttir, metadata)
        except Exception as error:
            return _failure("ttadapter (triton-adapter-opt)", error)
        found = [f"{what} ({pattern})" for pattern, what in CUDA_ONLY.items() if pattern in linalg]
        if found:
            return Outcome(False, f"lowered, but CUDA-only constructs survive: {', '.join(found)}", helpers)
        return Outcome(True, f"lowered ({len(linalg) / 1e3:.0f} kB of Linalg/HIVM)", helpers)


def _failure(stage, error) -> Outcome:
    stderr = getattr(error, "stderr", None)  # triton-adapter-opt's diagnostics
    message = stderr.decode(errors="replace") if stderr else f"{type(error).__name__}: {error}"
    return Outcome(False, f"{stage} failed:\n{_indent(message)}")


def _indent(text, limit=40):
    lines = text.strip().splitlines()
    shown = lines[:limit] + ([f"... ({len(lines) - limit} more lines)"] if len(lines) > limit else [])
    return "\n".join("      " + line for line in shown)


# ----------------------------------------------------------------------------------------
# The gate
# ----------------------------------------------------------------------------------------

def _coverage(args: dict, dtype) -> dict:
    """The classes one lowered call reached, from the arguments the launcher built."""
    from attnformal.masks import CAUSAL_MODES

    return {
        "dtype": str(dtype).removeprefix("torch."),
        "CAUSAL": CAUSAL_MODES[args["CAUSAL"]],
        "HAS_ATTN_MASK": args["HAS_ATTN_MASK"], "HAS_KEEP": args["HAS_KEEP"], "HAS_SOFTCAP": args["HAS_SOFTCAP"],
        "BLOCK_D": args["BLOCK_D"], "BLOCK_DV": args["BLOCK_DV"],
        "BLOCK_M x BLOCK_N": f"{args['BLOCK_M']}x{args['BLOCK_N']}",
        "GQA group > 1": args["group"] > 1,
        "split-KV": args.get("num_splits", 1) > 1,
    }


def required_coverage(cases_module) -> dict:
    """What the lowered variants must reach: every value of every feature, class and dtype shipped."""
    blocks = cases_module.ACCEPTED_BLOCKS
    return {
        "dtype": set(DTYPES), "CAUSAL": {None, "top_left", "bottom_right"},
        "HAS_ATTN_MASK": {False, True}, "HAS_KEEP": {False, True}, "HAS_SOFTCAP": {False, True},
        "BLOCK_D": set(HEAD_DIMS), "BLOCK_DV": set(HEAD_DIMS),
        "BLOCK_M x BLOCK_N": {f"{m}x{n}" for m in blocks for n in blocks} | {"128x64"},
        "GQA group > 1": {False, True}, "split-KV": {False, True},
    }


def load_kernels(path: str | None):
    if path is None:
        return importlib.import_module("attnformal.kernels.triton_flash")
    spec = importlib.util.spec_from_file_location(f"ascend_check_kernels_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(kernels, configs, out=sys.stdout, complete=True) -> int:
    """Lower every call of every configuration; print the report; return the exit status.

    ``complete``: the configurations are the whole list, so the coverage they reach is checked.
    """
    from triton.runtime.jit import JITFunction

    from attnformal.spec import AttentionSpec

    kernel_functions = {name for name, value in vars(kernels).items() if isinstance(value, JITFunction)}
    if not kernel_functions:
        print("ascend-check: the kernel module has no compiled @triton.jit function: is TRITON_INTERPRET set? "
              "Unset it (the kernels would be interpreted, not compiled).", file=out)
        return 1
    lowerer = Lowerer()
    variants: dict[tuple, Future] = {}
    planned = []  # (config, [(call, future or None for an empty grid)] or the launcher's refusal)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for config in configs:
            q, k, v = config.inputs
            if q.numel() == 0:  # as in the launcher: no query rows, no kernel
                planned.append((config, []))
                continue
            try:
                spec = AttentionSpec.from_inputs(q, k, v, **config.kwargs)
                kernels.check_launchable(spec, config.schedule, q.dtype, "npu")
                calls = kernels.Launch(spec, config.schedule, q).calls(q, k, v)
            except (ValueError, NotImplementedError) as refusal:
                planned.append((config, f"refused by the launcher: {refusal}"))
                continue
            lowered = []
            for call in calls:
                if not all(n > 0 for n in call.grid):
                    lowered.append((call, None))
                    continue
                key, source = lowerer.variant(call.kernel, call.args)
                if key not in variants:
                    variants[key] = lowerer.submit(pool, source)
                lowered.append((call, variants[key]))
            planned.append((config, lowered))
    seconds = time.perf_counter() - start

    passed = failed = 0
    reached = defaultdict(set)
    called = set()
    for config, lowered in planned:
        if isinstance(lowered, str):
            failed += 1
            print(f"{config.name}: FAILED, {lowered}", file=out)
            continue
        outcomes = [(call, future and future.result()) for call, future in lowered]
        print(f"{config.name}: " + (", ".join(
            f"{call.kernel.fn.__name__} " + ("not launched (empty grid)" if outcome is None else
                                             "lowered" if outcome.ok else "FAILED") for call, outcome in outcomes)
            or "not launched (no query rows)"), file=out)
        for call, outcome in outcomes:
            if outcome is None:
                continue
            called |= outcome.helpers | {call.kernel.fn.__name__}
            if outcome.ok:
                passed += 1
                for feature, value in _coverage(call.args, config.inputs[0].dtype).items():
                    reached[feature].add(value)
            else:
                failed += 1
                print(f"  {call.kernel.fn.__name__}: {outcome.detail}", file=out)
    problems = []
    if complete:
        for feature, values in required_coverage(kernel_test_cases()).items():
            missing = values - reached[feature]
            print(f"covered {feature}: {sorted(reached[feature], key=str)}", file=out)
            if missing:
                problems.append(f"{feature} {sorted(missing, key=str)} never lowered")
        unreached = sorted(kernel_functions - called)
        if unreached:
            problems.append(f"@triton.jit functions in no lowered kernel: {unreached}")
    for problem in problems:
        print(f"ascend-check: FAILED: {problem}", file=out)
    print(f"ascend-check: {len(configs)} configurations, {len(variants)} distinct kernel variants lowered "
          f"through ttir and ttadapter for {TARGET[1]} in {seconds:.1f} s; npubin (bishengir-compile) not run",
          file=out)
    print(f"ascend-check: {passed} passed, {failed + len(problems)} failed", file=out)
    return 0 if passed and not failed and not problems else 1


def main(argv=None, out=sys.stdout) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", help="a kernel module file to lower instead of attnformal.kernels.triton_flash")
    parser.add_argument("--config", action="append", help="lower only this configuration (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the configuration names and exit")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("ascend-check: TRITON_INTERPRET is set, so the kernels would be interpreted, not compiled; "
              "run with TRITON_INTERPRET=0", file=out)
        return 1
    if args.kernels and not (args.kernels.endswith(".py") and Path(args.kernels).is_file()):
        parser.error(f"argument --kernels: expected a Python file, got {args.kernels!r}")
    kernels = load_kernels(args.kernels)
    configs = configurations(kernels)
    if args.list:
        print("\n".join(config.name for config in configs), file=out)
        return 0
    if args.config:
        unknown = set(args.config) - {config.name for config in configs}
        if unknown:
            print(f"ascend-check: unknown configurations {sorted(unknown)}; see --list", file=out)
            return 1
        configs = [config for config in configs if config.name in args.config]
    return run(kernels, configs, out, complete=not args.config)


if __name__ == "__main__":
    sys.exit(main())
