"""The prover's runner: deterministic resources, the verdict cache, progress on a terminal, Ctrl-C."""

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

from attnformal import proofcache
from sigint import ctrl_c_reaches_python
from test_planted_bugs import installed_copy


def _prove(*argv, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "attnformal.prove", *argv], capture_output=True, text=True,
                          env=env, cwd=cwd)


def _resources(path):
    data = json.loads(path.read_text())
    return ([(o["number"], o["rlimit"], [(p["claim"], p["status"], p["rlimit"]) for p in o["checks"]])
             for o in data["obligations"]],
            [(c["name"], c["proof"]["status"], c["proof"]["rlimit"]) for c in data["controls"]])


def test_the_resources_an_obligation_uses_are_the_same_in_two_runs(tmp_path):
    # obligation 5: nonlinear integer queries (symbolic block sizes), the kind whose time varies most
    runs = [tmp_path / "first.json", tmp_path / "second.json"]
    for path in runs:
        result = _prove("--only", "5", "--no-cache", "--json", str(path))
        assert result.returncode == 0, result.stdout + result.stderr
    first, second = map(_resources, runs)
    assert first == second
    assert first[0][0][1] > 0 and all(units > 0 for _, _, units in first[0][0][2][1:]), "units are counted"


def _copy_env(tmp_path):
    return {**os.environ, "PYTHONPATH": str(installed_copy(tmp_path / "copy")),
            "ATTNFORMAL_PROVE_CACHE": str(tmp_path / "cache")}


def test_an_unchanged_obligation_comes_from_the_cache_and_a_changed_line_it_imports_proves_it_again(tmp_path):
    env = _copy_env(tmp_path)
    first = _prove("--only", "gqa", env=env, cwd=tmp_path)
    second = _prove("--only", "gqa", env=env, cwd=tmp_path)
    assert first.returncode == second.returncode == 0, first.stdout + first.stderr
    assert "(cached, key" not in first.stdout and "proved (cached, key" in second.stdout
    assert "refuted (cached)" in second.stdout
    ops = tmp_path / "copy" / "attnformal" / "ops.py"  # imported by the GQA obligation through spec.py
    ops.write_text(ops.read_text().replace('"""``floor(a / b)`` for a positive ``b``."""',
                                           '"""``floor(a / b)`` for a positive ``b`` (changed)."""', 1))
    third = _prove("--only", "gqa", env=env, cwd=tmp_path)
    assert third.returncode == 0 and "(cached, key" not in third.stdout
    assert "(cached, key" in _prove("--only", "gqa", env=env, cwd=tmp_path).stdout
    assert "(cached, key" not in _prove("--only", "gqa", "--no-cache", env=env, cwd=tmp_path).stdout


def test_a_cache_filled_by_python_m_is_read_by_every_entry_point(tmp_path):
    # run as ``-m``, the module is ``__main__``: its results must still pickle under ``attnformal.prove``
    env = _copy_env(tmp_path)
    assert _prove("--only", "gqa", env=env, cwd=tmp_path).returncode == 0
    for entry in (["-c", "import sys; from attnformal.prove import main; sys.exit(main(['--only', 'gqa']))"],
                  ["-m", "attnformal.command", "prove", "--only", "gqa"]):
        result = subprocess.run([sys.executable, *entry], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert result.returncode == 0 and "proved (cached, key" in result.stdout, (entry, result.stdout)


def test_an_import_added_in_the_same_process_is_followed(monkeypatch):
    # the parsed import statements are memoised by the file's text, so a new import is never missed
    path = proofcache._origin("attnformal.proofs.gqa")
    text, read = path.read_text(), proofcache.Path.read_text
    before = proofcache._imports("attnformal.proofs.gqa", path)
    monkeypatch.setattr(proofcache.Path, "read_text",
                        lambda self: text + "\nimport attnformal.proofs.ieee\n" if self == path else read(self))
    after = proofcache._imports("attnformal.proofs.gqa", path)
    assert "attnformal.proofs.ieee" not in before and "attnformal.proofs.ieee" in after


def _key(name, **settings):
    from attnformal.logic import Settings
    from attnformal.proofs import OBLIGATIONS

    module = next(m for m in OBLIGATIONS if m.__name__.endswith("." + name))
    return proofcache.VerdictCache("unused").key("checks", module, Settings(**settings))


def test_every_line_of_every_file_an_obligation_imports_is_in_its_key(monkeypatch):
    files = proofcache.dependencies("attnformal.proofs.gqa")
    assert {"attnformal.proofs.gqa", "attnformal.spec", "attnformal.ops", "attnformal.logic"} <= set(files)
    assert "attnformal.proofs.ieee" not in files and "attnformal.prove" not in files  # only what it imports
    original, read = _key("gqa"), proofcache.Path.read_bytes
    for name, path in files.items():
        lines = path.read_bytes().splitlines(keepends=True)
        for number in (0, len(lines) // 2, len(lines) - 1):
            changed = b"".join(lines[:number] + [b"#" + lines[number]] + lines[number + 1:])
            monkeypatch.setattr(proofcache.Path, "read_bytes",
                                lambda self, p=path, c=changed: c if self == p else read(self))
            assert _key("gqa") != original, f"{name} line {number + 1}"
    monkeypatch.undo()
    assert _key("gqa") == original and _key("gqa", budget=1) != original  # and the budget


def test_a_kernel_an_obligation_lowers_without_importing_it_is_in_its_key(monkeypatch):
    # obligation 20 lowers kernels/triton_flash.py in a child Python: its DEPENDS_ON puts the file in the key
    path = proofcache._origin("attnformal.kernels.triton_flash")
    assert "attnformal.kernels.triton_flash" in proofcache.dependencies("attnformal.kernels.triton_flash")
    original, unrelated, read = _key("triton_kernels"), _key("gqa"), proofcache.Path.read_bytes
    monkeypatch.setattr(proofcache.Path, "read_bytes", lambda self: read(self) + b"#" if self == path else read(self))
    assert _key("triton_kernels") != original
    assert _key("gqa") == unrelated  # an obligation that does not name it is not keyed by it


def test_on_a_terminal_each_obligation_is_shown_as_it_finishes():
    controller, terminal = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "attnformal.prove", "--only", "gqa", "--no-cache"],
                               stdout=subprocess.PIPE, stderr=terminal, text=True)
    os.close(terminal)
    out, _ = process.communicate(timeout=600)
    shown = _read_all(controller)
    assert process.returncode == 0
    assert "GQA head mapping" in shown and "proved" in shown and "controls: 2/2 as expected" in shown
    assert "controls:" not in out  # the report itself is unchanged


def _read_all(fd) -> str:
    chunks = []
    while select.select([fd], [], [], 1)[0]:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the terminal's other end closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def test_ctrl_c_ends_with_interrupted_exit_130_and_no_report(tmp_path):
    report = tmp_path / "r.json"
    process = subprocess.Popen([sys.executable, "-m", "attnformal.prove", "--no-cache", "--json", str(report)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=ctrl_c_reaches_python)
    _wait_until_workers_run(process.pid)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, (out, err)
    assert err.strip() == "python -m attnformal.prove: interrupted"
    assert "Traceback" not in out + err and "obligations proved" not in out and not report.exists()


def _wait_until_workers_run(pid, limit_s=300):
    """Until the prover has forked its first worker (its children are listed): the run is under way."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        if children:
            return
        time.sleep(0.2)
    raise AssertionError("the prover started no worker")


def test_obligations_that_evaluate_no_kernel_do_not_import_torch_or_triton():
    script = ("import sys; from attnformal.prove import main; code = main(['--only', 'gqa', '--no-cache']); "
              "print(code, 'torch' in sys.modules, 'triton' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.stdout.strip().splitlines()[-1] == "0 False False", result.stdout + result.stderr
