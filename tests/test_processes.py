"""`kspec verify`'s worker processes never outlive it: killed with SIGTERM or SIGKILL, or done, it
leaves no process behind (counted by session, which a new process group cannot leave), a process a
task starts cannot hold its standard output open, and a task that scribbles on its descriptors
costs one error, not the run."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import KSPEC, REPO, VALID_SPEC, mutate

TRIES = 600  # polls of /proc, 0.1 s apart at most: bounded, and generous for a loaded machine


def _spec(reference: str) -> str:
    body = "\n".join("  " + line for line in reference.splitlines())
    return mutate(VALID_SPEC, ("reference: |\n  return x * 2\n", f"reference: |\n{body}\n"))


def _project(tmp_path: Path, reference: str) -> Path:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "tiny.yaml").write_text(_spec(reference))
    r = subprocess.run([*KSPEC, "generate"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stdout + r.stderr
    return tmp_path


def _session(sid: int) -> list:
    """Processes (pid, command) of session `sid`, zombies left out."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append((int(entry), cmd))
    return out


def _wait_until_empty(sid: int) -> list:
    left = _session(sid)
    for _ in range(TRIES):
        if not left:
            break
        os.sched_yield()
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pass
        import time

        time.sleep(0.1)
        left = _session(sid)
    return left


def _wait_for(path: Path) -> None:
    import time

    for _ in range(TRIES * 2):
        if path.exists():
            return
        time.sleep(0.1)
    raise AssertionError(f"{path} never appeared")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killing_verify_leaves_no_process(sig, tmp_path):
    """The task starts a grandchild and sleeps; verify is then killed mid-task."""
    project = _project(tmp_path, "import pathlib, subprocess, time\n"
                                 "subprocess.Popen(['sleep', '300'])\n"
                                 "pathlib.Path('started').touch()\n"
                                 "time.sleep(300)\n"
                                 "return x * 2")
    proc = subprocess.Popen([*KSPEC, "verify", "--backend", "interpret", "--timeout", "600"], cwd=project,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        _wait_for(project / "started")
        assert len(_session(proc.pid)) >= 3  # verify, its worker, the worker's guard, the task's sleep
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
        assert _wait_until_empty(proc.pid) == []
    finally:
        with_group = [pid for pid, _ in _session(proc.pid)]
        for pid in with_group:
            os.kill(pid, signal.SIGKILL)


def test_a_process_a_task_starts_does_not_hold_standard_output(tmp_path):
    """$(kspec verify) returns when verify does, not when the task's grandchild would."""
    project = _project(tmp_path, "import subprocess\nsubprocess.Popen(['sleep', '300'])\nreturn x * 2")
    proc = subprocess.Popen([*KSPEC, "verify", "--backend", "interpret", "--case", "c"], cwd=project, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(REPO)))
    out, err = proc.communicate(timeout=240)  # would wait for the sleep if it held the pipe
    assert proc.returncode == 0, out.decode() + err.decode()
    assert b"1 passed" in out
    assert _wait_until_empty(proc.pid) == []


def test_a_task_that_writes_to_inherited_descriptors_is_one_error(tmp_path):
    project = _project(tmp_path, "import os\n"
                                 "for fd in range(3, 64):\n"
                                 "    try:\n"
                                 "        os.write(fd, b'\\x80\\x04garbage' * 64)\n"
                                 "    except OSError:\n"
                                 "        pass\n"
                                 "return x * 2")
    r = subprocess.run([*KSPEC, "verify", "--backend", "interpret", "--case", "c"], cwd=project, capture_output=True,
                       text=True, timeout=240, start_new_session=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert r.stdout.splitlines()[-1] == "0 passed, 0 failed, 1 errors, 0 skipped"
    assert "error" in r.stdout and ("result channel" in r.stdout or "worker died" in r.stdout)
