"""Issue 11, .ci/docker-engine.sh stop / clean and .ci/run's exit trap, without a Docker engine:
a stand-in process plays dockerd (its command line names our socket, as dockerd's does)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from hil_helpers import REPO

SCRIPT = REPO / ".ci" / "docker-engine.sh"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the script refuses to run as non-root")


def script(tmp_path, *args, **env_extra) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HIL_DOCKER_SOCK": str(tmp_path / "hil.sock"),
        "HIL_DOCKER_PID": str(tmp_path / "dockerd.pid"),
        "HIL_DOCKER_ROOT": str(tmp_path / "root"),
        # every path the script stops or deletes is the test's own: under CI the real engine
        # runs beside these tests, and its containerd (pid file and socket under the exec root)
        # must survive them (CI of 2026-12-01 lost it to a `stop` here)
        "HIL_DOCKER_EXEC_ROOT": str(tmp_path / "exec"),
        "HIL_CACHE": str(tmp_path / "cache"),
        **env_extra,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120
    )


def fake_dockerd(tmp_path, host: str) -> subprocess.Popen:
    # exec -a: argv[0] carries what a dockerd command line would, so /proc/PID/cmdline matches
    proc = subprocess.Popen(
        ["bash", "-c", f'exec -a "dockerd --host {host}" sleep 300'], start_new_session=True
    )
    (tmp_path / "dockerd.pid").write_text(str(proc.pid))
    time.sleep(0.2)
    return proc


@needs_root
def test_stop_ends_our_dockerd_only(tmp_path):
    ours = fake_dockerd(tmp_path, f"unix://{tmp_path / 'hil.sock'}")
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        proc = script(tmp_path, "stop")
        assert proc.returncode == 0, proc.stderr
        assert ours.wait(timeout=30) is not None
        assert other.poll() is None  # a process not on our socket is left alone
        assert not (tmp_path / "dockerd.pid").exists()
    finally:
        for p in (ours, other):
            if p.poll() is None:
                p.kill()
                p.wait()


def fake_containerd(exec_root) -> subprocess.Popen:
    (exec_root / "containerd").mkdir(parents=True)
    proc = subprocess.Popen(
        ["bash", "-c", 'exec -a "containerd --config x" sleep 300'], start_new_session=True
    )
    (exec_root / "containerd" / "containerd.pid").write_text(str(proc.pid))
    time.sleep(0.2)
    return proc


@needs_root
def test_stop_and_clean_touch_only_the_given_exec_root(tmp_path):
    """The engine CI runs beside these tests keeps its containerd: stop ends the containerd
    under the exec root it was given (HIL_DOCKER_EXEC_ROOT), clean deletes that root only."""
    ours, other = fake_containerd(tmp_path / "exec"), fake_containerd(tmp_path / "other-exec")
    try:
        assert script(tmp_path, "stop").returncode == 0
        assert ours.wait(timeout=30) is not None
        assert script(tmp_path, "clean").returncode == 0
        assert not (tmp_path / "exec").exists()
        assert other.poll() is None and (tmp_path / "other-exec").exists()
    finally:
        for p in (ours, other):
            if p.poll() is None:
                p.kill()
                p.wait()


@needs_root
def test_stop_ignores_a_pid_file_naming_another_process(tmp_path):
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    (tmp_path / "dockerd.pid").write_text(str(other.pid))  # stale: the pid was reused
    try:
        proc = script(tmp_path, "stop")
        assert proc.returncode == 0 and "no dockerd of ours running" in proc.stderr
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


@needs_root
def test_clean_stops_and_deletes_the_data_root(tmp_path):
    root = tmp_path / "root"
    (root / "vfs" / "dir").mkdir(parents=True)
    (root / "vfs" / "dir" / "layer").write_bytes(b"x" * 1000)
    (tmp_path / "cache").mkdir()
    ours = fake_dockerd(tmp_path, f"unix://{tmp_path / 'hil.sock'}")
    try:
        proc = script(tmp_path, "clean")
        assert proc.returncode == 0, proc.stderr
        assert ours.wait(timeout=30) is not None
        assert not root.exists() and (tmp_path / "cache").exists()
        assert script(tmp_path, "clean", "--cache").returncode == 0
        assert not (tmp_path / "cache").exists()
    finally:
        if ours.poll() is None:
            ours.kill()


@needs_root
def test_clean_deletes_a_data_root_bind_mounted_onto_itself(tmp_path):
    """As dockerd leaves it: unless the root itself is unmounted, rm fails with EBUSY."""
    root = tmp_path / "root"
    (root / "overlay2").mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
    try:
        proc = script(tmp_path, "clean")
        assert proc.returncode == 0, proc.stderr
        assert not root.exists()
    finally:
        subprocess.run(["umount", "-l", str(root)], capture_output=True)


def stand_in_mount(tmp_path, body: str) -> dict:
    """PATH with `mount` and `umount` replaced: the driver probe's mount does what body says."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    for name, text in (("mount", body), ("umount", "exit 0")):
        (bin_ / name).write_text(f"#!/bin/bash\n{text}\n")
        (bin_ / name).chmod(0o755)
    return {"PATH": f"{bin_}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


@needs_root
def test_driver_is_vfs_where_overlayfs_does_not_mount(tmp_path):
    proc = script(tmp_path, "driver", **stand_in_mount(tmp_path, "exit 32"))
    assert proc.returncode == 0 and proc.stdout.startswith("vfs: overlayfs does not mount"), proc
    # the probe cleans up after itself: nothing of it stays in the data root
    assert list((tmp_path / "root").iterdir()) == []


@needs_root
def test_driver_is_vfs_where_a_write_through_the_overlay_misses_the_upper_directory(tmp_path):
    # "mounted", but the merged directory is a plain directory: writes never reach upper/
    proc = script(tmp_path, "driver", **stand_in_mount(tmp_path, "exit 0"))
    assert proc.returncode == 0 and proc.stdout.startswith("vfs:"), proc


@needs_root
def test_driver_override_wins_without_probing(tmp_path):
    env = stand_in_mount(tmp_path, f"touch {tmp_path / 'probed'}; exit 32")
    proc = script(tmp_path, "driver", HIL_DOCKER_STORAGE_DRIVER="overlay2", **env)
    assert proc.stdout == "overlay2: HIL_DOCKER_STORAGE_DRIVER\n", proc
    assert not (tmp_path / "probed").exists()


# an overlay "mount" that works as far as the probe can tell: the merged directory becomes the
# upper one, so a write through it lands there
OVERLAY_MOUNT = """
upper=$(echo "$*" | sed -E 's/.*upperdir=([^,]*),.*/\\1/')
target="${@: -1}"
rm -rf "$target" && ln -s "$upper" "$target"
"""

# dockerd as the script starts it: refuses a driver matching the pattern $REFUSE (exits, as
# dockerd does when its graph driver fails), otherwise answers (through the stand-in docker)
FAKE_DOCKERD = """
while [ $# -gt 0 ]; do
    case "$1" in
    --host) host=$2; shift ;;
    --storage-driver) driver=$2; shift ;;
    --pidfile) pidfile=$2; shift ;;
    esac
    shift
done
echo "dockerd $driver" >>"$STATE/calls"
if [[ "$driver" =~ ^($REFUSE)$ ]]; then
    echo "error initializing graphdriver: $driver" >&2
    exit 1
fi
echo $$ >"$pidfile"
echo "$driver" >"$STATE/up"
exec -a "dockerd --host $host" sleep 300
"""

FAKE_DOCKER = """
[ -f "$STATE/up" ] || exit 1
case "$*" in *"info --format"*) cat "$STATE/up" ;; esac
exit 0
"""


def start_with_stand_ins(tmp_path, refuse: str, driver: str = "") -> tuple:
    """`start` with dockerd, docker, debootstrap and mount stood in, wheels already collected,
    ``driver`` as HIL_DOCKER_STORAGE_DRIVER: (the completed process, the dockerd starts made)."""
    state = tmp_path / "state"
    state.mkdir()
    env = stand_in_mount(tmp_path, OVERLAY_MOUNT)
    for name, body in (("dockerd", FAKE_DOCKERD), ("docker", FAKE_DOCKER), ("debootstrap", "")):
        (tmp_path / "bin" / name).write_text(f"#!/bin/bash\n{body}\n")
        (tmp_path / "bin" / name).chmod(0o755)
    wheels = tmp_path / "cache" / "wheels"
    wheels.mkdir(parents=True)
    (wheels / ".complete").write_text("torch-x.whl pytest pytest-timeout tabulate hypothesis\n")
    proc = script(
        tmp_path, "start", STATE=str(state), REFUSE=refuse, HIL_TORCH_WHEEL="/nowhere/torch-x.whl",
        HIL_DOCKER_LOG=str(tmp_path / "dockerd.log"), HIL_DOCKER_STORAGE_DRIVER=driver, **env,
    )  # fmt: skip
    try:
        calls = (state / "calls").read_text().splitlines()
    finally:
        script(tmp_path, "stop", **env)
    return proc, calls


@needs_root
def test_start_falls_back_to_vfs_when_dockerd_refuses_overlay2(tmp_path):
    proc, calls = start_with_stand_ins(tmp_path, refuse="overlay2")
    assert proc.returncode == 0, proc.stderr
    assert calls == ["dockerd overlay2", "dockerd vfs"], calls
    assert "storage driver vfs: dockerd refused overlay2" in proc.stderr
    assert "error initializing graphdriver: overlay2" in proc.stderr  # the log's reason, shown


@needs_root
def test_start_keeps_overlay2_when_dockerd_accepts_it(tmp_path):
    proc, calls = start_with_stand_ins(tmp_path, refuse="")
    assert proc.returncode == 0, proc.stderr
    assert calls == ["dockerd overlay2"], calls


@needs_root
def test_start_fails_when_dockerd_refuses_both_drivers(tmp_path):
    proc, calls = start_with_stand_ins(tmp_path, refuse="overlay2|vfs")
    assert proc.returncode == 1 and calls == ["dockerd overlay2", "dockerd vfs"], calls
    assert "did not come up on vfs either" in proc.stderr


@needs_root
def test_an_overridden_driver_that_fails_is_not_retried(tmp_path):
    proc, calls = start_with_stand_ins(tmp_path, refuse="overlay2", driver="overlay2")
    assert proc.returncode == 1 and calls == ["dockerd overlay2"], calls


@needs_root
def test_clean_refuses_slash(tmp_path):
    proc = script(tmp_path, "clean", HIL_DOCKER_ROOT="/")
    assert "refusing to delete '/'" in proc.stderr and proc.returncode != 0


@needs_root
def test_unknown_command(tmp_path):
    proc = script(tmp_path, "bogus")
    expected = "expected start, stop, clean [--cache], driver or status"
    assert proc.returncode == 2 and expected in proc.stderr


def ci_run(tmp_path, nox_rc: int = 0, **env_extra) -> tuple:
    """.ci/run in a copy of the tree whose docker-engine.sh, python3 and nox are stand-ins that
    log their calls: (exit code, the log's lines)."""
    tree = tmp_path / "tree"
    (tree / ".ci").mkdir(parents=True)
    (tree / ".ci" / "run").write_text((REPO / ".ci" / "run").read_text())
    log = tmp_path / "calls.log"
    (tree / ".ci" / "docker-engine.sh").write_text(f'echo "engine ${{1:-start}}" >>{log}\n')
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    stand_ins = (
        ("python3", "exit 0"),
        # present, so .ci/run does not apt-get a real clang for the clang check
        ("clang++-16", "exit 0"),
        ("nox", f'echo "nox $*" >>{log}; exit {nox_rc}'),
    )
    for name, body in stand_ins:
        (bin_ / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_ / name).chmod(0o755)
    env = {
        "PATH": f"{bin_}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HIL_DOCKER_PID": str(tmp_path / "dockerd.pid"),
        **env_extra,
    }
    proc = subprocess.run(
        ["bash", str(tree / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60
    )
    return proc.returncode, log.read_text().splitlines() if log.exists() else []


def test_ci_run_stops_the_engine_it_started(tmp_path):
    code, calls = ci_run(tmp_path)
    assert code == 0 and calls[0] == "engine start" and calls[-1] == "engine stop", calls


def test_ci_run_stops_the_engine_after_a_failure_and_keeps_the_exit_code(tmp_path):
    code, calls = ci_run(tmp_path, nox_rc=3)
    # the first nox session fails (the clang check, then the README's tests): nothing after it
    # runs but the engine's stop, and the session's exit code is the run's
    assert code == 3 and calls == ["engine start", "nox -s clang", "engine stop"], calls


def test_ci_run_runs_the_readme_test_command(tmp_path):
    code, calls = ci_run(tmp_path)
    assert code == 0 and "nox -s tests" in calls, calls


def test_ci_run_keeps_the_engine_when_asked(tmp_path):
    code, calls = ci_run(tmp_path, HIL_KEEP_ENGINE="1")
    assert code == 0 and "engine stop" not in calls, calls


def test_ci_run_leaves_an_engine_it_did_not_start(tmp_path):
    already = subprocess.Popen(["sleep", "300"], start_new_session=True)
    (tmp_path / "dockerd.pid").write_text(str(already.pid))
    try:
        code, calls = ci_run(tmp_path)
        assert code == 0 and "engine stop" not in calls, calls
    finally:
        already.kill()
        already.wait()
