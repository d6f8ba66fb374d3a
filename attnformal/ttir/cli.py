"""``python -m attnformal.prove --triton FILE.py:KERNEL`` (or ``MODULE:ATTR``; repeated for several): the TTIR
theorems, one line each; each refutation's smallest launch is written as a battery case that replays on the
kernel's own entry point (``verify --impl FILE.py:attention --replay CASE``), or on a host that launches a
third-party kernel as its own host does (``ATTNFORMAL_KERNEL_FILE=FILE.py verify --impl MODULE:attention ...``)."""

from __future__ import annotations

import os
import shlex
import sys

from attnformal.logic import PROVED, REFUTED, RLIMIT_UNIT
from attnformal.tiling import ReproFolders
from attnformal.ttir.launch import KERNEL_FILE_ENV, LAUNCHES
from attnformal.ttir.theorems import Limits, load_attr, prove_launch


def launch_for(target: str):
    """The launch description of a kernel: by ``module:attr``; for a file, by its name and the attribute (a
    third-party kernel's description is keyed by its file's name), else by the attribute's name alone among the
    project's modules (a copy of one of its kernels)."""
    if target in LAUNCHES:
        return LAUNCHES[target]
    where, _, attr = target.rpartition(":")
    stem = where.rpartition("/")[2].removesuffix(".py")
    matches = [launch for name, launch in LAUNCHES.items() if name == f"{stem}:{attr}"] or \
        [launch for name, launch in LAUNCHES.items() if name.endswith(f":{attr}") and "." in name.partition(":")[0]]
    if len(matches) != 1:
        raise ValueError(f"argument '--triton': no launch description for {target!r}; known: {', '.join(LAUNCHES)}")
    return matches[0]


REPRO_DIR = "verify-repro"  # where the battery writes its reproducers too
MAX_REPLAY_SCORES = 2 ** 22  # a refutation's shape larger than this is not written as a case


def prove_triton(target: str, limits: Limits = Limits(), out=sys.stdout, repro_dir=REPRO_DIR, configs=None,
                 compiler="cuda") -> int:
    """Every theorem on every configuration of the kernel's launch (or ``configs``), on the TTIR of ``compiler``'s
    front end (:data:`~attnformal.ttir.lower.TARGETS`); 0 iff all are proved."""
    try:
        launch = launch_for(target)
        fn = load_attr(target)
    except (ValueError, ImportError, AttributeError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    ok = True
    folders = None if repro_dir is None else ReproFolders(repro_dir)
    print(f"kernel {target}" + ("" if compiler == "cuda" else f" (TTIR of the {compiler} front end)"), file=out)
    for config, proofs in prove_launch(launch, fn=fn, limits=limits, configs=configs, target=compiler):
        print(f"config {config_name(config)}", file=out)
        for number, proof in enumerate(proofs):
            ok &= proof.status == PROVED
            extra = proof.detail or (proof.countermodel or "")
            print(f"  {proof.status:8} {proof.rlimit / RLIMIT_UNIT:7.1f} M units {proof.seconds:6.1f} s  {proof.claim}  {extra}",
                  file=out)
            if proof.status == REFUTED and proof.countermodel and folders is not None and launch.entry:
                print(f"           replay: {refutation_case(proof, launch, config, target, folders, number)}", file=out)
    return 0 if ok else 1


def refutation_case(proof, launch, config, target: str, folders, number: int = 0, seed: int = 0) -> str:
    """The battery case of a refutation's launch (its lengths, head counts and dims; the causal mode the launch
    holds the configuration to, and its softcap) in the launch's dtype, written for its entry point; the replay
    command (with the kernel's file in the environment, for a host entry point), or why there is none."""
    from attnformal.cli import DTYPES
    from attnformal.verify.cases import random_case, shape
    from attnformal.verify.replay import write_reproducer

    countermodel = proof.countermodel or {}
    if "valuation" in countermodel:
        return "no case: the refutation is at chosen values, which a random case does not reproduce"
    sizes = {name: int(value) for name, value in countermodel.items() if name in launch.sizes}
    needed = ("B", "Hq", "Hkv", "Sq", "Sk", "D", "Dv")
    if any(name not in sizes for name in needed):
        return "no case: the refutation shows no complete launch"
    b, hq, hkv, sq, sk, d, dv = (sizes[name] for name in needed)
    if b * hq * max(sq * sk, sq * d, sk * d) > MAX_REPLAY_SCORES:
        return f"no case: the launch is too large to replay ({b}x{hq}x{sq}x{sk} scores)"
    where, _, kernel = target.rpartition(":")
    impl, env = launch.entry, ""
    if ":" not in impl:  # a name in the kernel's own module
        impl = f"{where}:{impl}"
    elif where.endswith(".py"):  # a host outside it, told which file's kernel to launch
        env = f"{KERNEL_FILE_ENV}={shlex.quote(os.path.abspath(where))} "
    kwargs = {"causal": launch.geometry({"Sq": sq, "Sk": sk}, config).causal,  # the mode the launch holds it to
              "softcap": 4.0 if config.get("HAS_SOFTCAP") else None}
    if "fill" in countermodel:  # a finite mask fill shows once the scores spread past it: scores scaled to its size
        kwargs["scale"] = abs(float(countermodel["fill"]))
    case = random_case(f"ttir-{kernel}", shape(batch=b, heads_q=hq, heads_kv=hkv, len_q=sq, len_k=sk, head_dim=d,
                                               head_dim_v=dv), DTYPES[launch.dtype], "cpu", seed,
                       grad=launch.backward, **kwargs)
    theorem = proof.claim.split(":")[0].replace(" ", "-")
    path = folders.folder(impl) / f"ttir-{kernel}-{theorem}-{number}.pt"
    write_reproducer(path, case, impl=impl, check=f"ttir:{theorem}", dtype=launch.dtype, lse=True,
                     backward=launch.backward, env=env)
    note = f" (at num_splits 1, not the refutation's {sizes['S']})" if sizes.get("S", 1) != 1 else ""
    return f"{env}python -m attnformal.verify --impl {impl} --replay {path}{note}"


_MODES = ("CAUSAL", "IS_CAUSAL", "STAGE")  # the constexprs that name a kernel's causal mode


def config_name(config: dict) -> str:
    """``CAUSAL=2 HAS_SOFTCAP``: the causal mode and the feature flags that are on (the configurations differ there)."""
    return " ".join([f"{name}={config[name]}" for name in _MODES if name in config]
                    + [name for name, value in config.items() if value is True and name not in _MODES])
