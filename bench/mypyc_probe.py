"""Does compiling the hot detection path with mypyc pay? A probe, not a build (see docs/performance-log.md,
"Compiling the hot path with mypyc").

    .venv/bin/python bench/mypyc_probe.py [--all] [--callgrind] [--runs 3] [--file bench/out/fleet.jsonl] [--keep DIR]

Copies ``HEAD``'s tracked files to a scratch tree, makes there the few edits that let mypyc compile
the engine and the per-GPU share rules (mypyc drops a msgspec ``Struct``'s class keywords and
type-checks a pydantic model's class body, so those classes move to pure modules; the engine's
context stays a Python class: a native class cannot extend one with ``__slots__``), compiles
:data:`MODULES` there (with ``--all`` :data:`RULES` too), checks that ``backtest`` gives the same alerts
on the first 4,000 lines of the file in both trees, then measures both, alternating: ``--callgrind`` the CPU instructions an event
(lines 1,001-4,000: N = 4,000 minus N = 1,000, ``PYTHONHASHSEED=0``), and ``--runs`` in-process
events/s by CPU time on the whole file. Needs a C compiler (and valgrind for ``--callgrind``).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.backtest import head, instructions_per_event  # noqa: E402

MODULES = ["detector/engine.py", "detector/detectors/gpu_share.py", "detector/detectors/partly_idle_gpu.py",
           "detector/detectors/unallocated_gpu.py", "detector/detectors/scrape.py", "detector/detectors/activity.py",
           "detector/align.py", "detector/backtest.py"]  # fmt: skip
"""What the probe compiles by default: the engine's loop, the two per-GPU share rules, the scrape view,
the aligner and backtest's own loop (the hottest Python of a backtest by cProfile)."""
RULES = ["gpu_episode", "idle_gpu", "stuck_gpu", "telemetry_stale", "data_starved_training"]
"""With ``--all``, also these rules (the other four that see every GPU scrape, and their base): each
split in two, what comes before its detector class into a pure ``<rule>_decl`` module."""
_DETECTOR_BASES = {"DetectorBase", "GpuEpisode", "GpuShare"}

_BUILD = """
import sys
from setuptools import Distribution
from mypyc.build import mypycify
dist = Distribution({"name": "probe", "ext_modules": mypycify(sys.argv[1:], opt_level="3")})
dist.script_args = ["build_ext", "--inplace"]  # a Distribution of its own: pyproject.toml is not read
dist.parse_command_line()
dist.run_commands()
"""

_RUN = """
import hashlib, json, sys, time
import msgspec
from detector.backtest import backtest
from detector.rules import load_rules
from detector.runtime import tune_gc
tune_gc()
rules = load_rules("rules")
cpu = time.process_time()
result = backtest(sys.argv[1], rules)
cpu = time.process_time() - cpu
digest = hashlib.sha256(msgspec.json.encode([msgspec.to_builtins(a) for a in result.alerts])).hexdigest()[:8]
print(json.dumps({"events": result.events, "alerts": len(result.alerts), "hash": digest, "cpu_s": cpu}))
"""


def _once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"anchor not found once: {old[:60]!r}"
    return text.replace(old, new)


def _top_names(source: str) -> list[str]:
    """The names a module's top level binds (classes, functions, assignments)."""
    names: list[str] = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return sorted({n for n in names if n != "__all__"})


def _split_gpu_share(tree: Path) -> None:
    """Params and structs of ``gpu_share`` before its detector class (and its two rules' params) into a pure
    ``gpu_share_decl``; the detector's code stays, importing them (its state's structs are in the pure
    ``gpu_share_state`` already)."""
    path = tree / "detector/detectors/gpu_share.py"
    text = path.read_text()
    start = text.index("\nclass GpuShareParams(Params):")
    end = text.index("\nclass GpuShare(DetectorBase):")
    assert text.count("\nclass GpuShareParams(Params):") == 1 and text.count("\nclass GpuShare(DetectorBase):") == 1
    decl = text[:end]
    moved = {}
    for rule, params in (("partly_idle_gpu", "PartlyIdleGpuParams"), ("unallocated_gpu", "UnallocatedGpuParams")):
        rpath = tree / f"detector/detectors/{rule}.py"
        rtext = rpath.read_text()
        node = next(n for n in ast.parse(rtext).body if isinstance(n, ast.ClassDef) and n.name == params)
        segment = ast.get_source_segment(rtext, node)
        assert segment is not None
        moved[rpath] = _once(rtext, segment, f"from detector.detectors.gpu_share_decl import {params}")
        decl += "\n\n" + segment + "\n"
    names = _top_names(decl)
    imports = f"from detector.detectors.gpu_share_decl import ({', '.join(names)})  # noqa: F401\n"
    (tree / "detector/detectors/gpu_share_decl.py").write_text(decl)
    path.write_text(text[:start] + "\n" + imports + "\n" + text[end:])
    for rpath, rtext in moved.items():
        rpath.write_text(rtext)


def _split_rule(tree: Path, rule: str) -> None:
    """What comes before the rule module's first detector class (its params, state structs and their
    helpers) into a pure ``<rule>_decl``; the detector's code stays, importing those names."""
    path = tree / f"detector/detectors/{rule}.py"
    text = path.read_text()
    body = ast.parse(text).body
    first = next(n for n in body if isinstance(n, ast.ClassDef)
                 and any(isinstance(b, ast.Name) and b.id in _DETECTOR_BASES for b in n.bases))  # fmt: skip
    assert not first.decorator_list
    lines = text.splitlines(keepends=True)
    start = first.lineno - 1
    decl = "".join(lines[:start])
    imports_end = max(n.end_lineno or n.lineno for n in body if isinstance(n, ast.Import | ast.ImportFrom) and n.lineno <= start)
    (tree / f"detector/detectors/{rule}_decl.py").write_text(decl)
    names = ", ".join(_top_names(decl))
    path.write_text("".join(lines[:imports_end]) + f"\nfrom detector.detectors.{rule}_decl import ({names})  # noqa\n\n\n"
                    + "".join(lines[start:]))  # fmt: skip


def _split_engine(tree: Path) -> None:
    """The engine's snapshot struct into a pure module; its context a Python class."""
    path = tree / "detector/engine.py"
    text = path.read_text()
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "_Snapshot")
    segment = ast.get_source_segment(text, node)
    assert segment is not None
    (tree / "detector/engine_snapshot.py").write_text(
        "from __future__ import annotations\n\nimport msgspec\n\nfrom detector.detectors import ResourceInfo\n\n\n"
        + segment + "\n")  # fmt: skip
    text = _once(text, segment, "from detector.engine_snapshot import _Snapshot")
    text = _once(text, "\nclass _KeyContext(Context):", "\n@mypyc_attr(native_class=False)\nclass _KeyContext(Context):")
    text = _once(text, "\nimport structlog\n", "\nimport structlog\nfrom mypy_extensions import mypyc_attr\n")
    path.write_text(text)


def _mark_backtest(tree: Path) -> None:
    """backtest's exception a Python class: a native class cannot extend ``RuntimeError``."""
    path = tree / "detector/backtest.py"
    text = _once(path.read_text(), "\nclass ShardFailed(RuntimeError):",
                 "\n@mypyc_attr(native_class=False)\nclass ShardFailed(RuntimeError):")  # fmt: skip
    path.write_text(_once(text, "\nimport zlib\n", "\nimport zlib\n\nfrom mypy_extensions import mypyc_attr\n"))


def prepare(tree: Path, rules: list[str]) -> None:
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    _split_gpu_share(tree)
    _split_engine(tree)
    _mark_backtest(tree)
    for rule in rules:
        _split_rule(tree, rule)
    modules = MODULES + [f"detector/detectors/{rule}.py" for rule in rules]
    built_out = subprocess.run([sys.executable, "-c", _BUILD, *modules], cwd=tree, capture_output=True, text=True)
    if built_out.returncode:  # mypy's errors come on stdout: say them, not only the exit status
        noise = ("gcc", "building", "copying", "creating")
        lines = [ln for ln in (built_out.stdout + built_out.stderr).splitlines() if not ln.startswith(noise)]
        sys.exit("mypyc could not build the scratch tree " + str(tree) + ":\n" + "\n".join(lines[-40:]))
    built = sorted(str(p.relative_to(tree)) for p in tree.glob("detector/**/*.so"))
    assert len(built) == len(modules), built
    print(f"compiled in {tree}: {', '.join(built)}")


def _run(tree: Path, path: str, *prefix: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
    return subprocess.run([*prefix, sys.executable, "-c", _RUN, path], cwd=tree, env=env, capture_output=True, text=True,
                          check=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", default=str(ROOT / "bench/out/fleet.jsonl"))
    ap.add_argument("--runs", type=int, default=3, help="in-process runs of each tree on the whole file (0: none)")
    ap.add_argument("--callgrind", action="store_true", help="CPU instructions an event, by valgrind's callgrind")
    ap.add_argument("--all", action="store_true", help="also compile the other GPU rules (RULES)")
    ap.add_argument("--keep", help="build the compiled tree here and keep it (default: a temporary folder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(args.keep or scratch) / "tree"
        tree.mkdir(parents=True)
        pure = Path(scratch) / "pure"
        pure.mkdir()
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(pure)], input=archive, check=True)
        prepare(tree, RULES if args.all else [])
        short, long = head(args.file, 1000, Path(scratch)), head(args.file, 4000, Path(scratch))
        same = {name: json.loads(_run(t, long).stdout.strip().splitlines()[-1]) for name, t in (("pure", pure), ("mypyc", tree))}
        print(f"first 4,000 lines: pure {same['pure']['alerts']} alerts {same['pure']['hash']}, "
              f"mypyc {same['mypyc']['alerts']} alerts {same['mypyc']['hash']}")  # fmt: skip
        assert same["pure"]["hash"] == same["mypyc"]["hash"], "the compiled tree's alerts differ"
        if args.callgrind:
            for name, t in (("pure", pure), ("mypyc", tree)):
                print(f"{name}: {instructions_per_event(t, short, long)[0]:,.0f} instructions an event (lines 1,001-4,000)")
        for i in range(args.runs):
            for name, t in (("pure", pure), ("mypyc", tree)):
                got = json.loads(_run(t, args.file).stdout.strip().splitlines()[-1])
                load = Path("/proc/loadavg").read_text().split()[0]
                print(f"run {i + 1} {name}: {got['events'] / got['cpu_s']:,.0f} events/s CPU "
                      f"({got['alerts']} alerts {got['hash']}, load {load})")  # fmt: skip


if __name__ == "__main__":
    main()
