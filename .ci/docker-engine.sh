#!/usr/bin/env bash
# A private Docker engine for the HIL tests, with a base image built without any registry.
#
#   bash .ci/docker-engine.sh [start]        # idempotent; prints the exports to use, last
#   bash .ci/docker-engine.sh stop           # stop the dockerd (and its containerd) started here
#   bash .ci/docker-engine.sh clean          # stop, then delete the engine's data root
#   bash .ci/docker-engine.sh clean --cache  # ... and the rootfs tarball + wheels cache too
#   bash .ci/docker-engine.sh status         # whether it runs, and disk used by root and cache
#
# What `start` does (each step is skipped when already done):
#   1. apt-get installs Debian's docker.io and debootstrap (needs root and the network).
#   2. starts dockerd as root on its own socket ($HIL_DOCKER_SOCK), no iptables, no bridge, its
#      own data-root / exec-root / pidfile, so it never touches a system docker; waits until it
#      answers. Storage driver: overlay2 where the kernel mounts overlayfs on the data root's
#      filesystem (a probe mount says) and dockerd accepts it, else vfs;
#      $HIL_DOCKER_STORAGE_DRIVER overrides (and is not retried as vfs). dockerd starts its own
#      containerd (socket and pid file under the exec-root /run/hil-docker/containerd).
#   3. debootstraps a minbase bookworm root filesystem with python3 (+ venv, pip, setuptools),
#      caches it as a tarball outside the repo ($HIL_CACHE) and `docker import`s it as
#      $HIL_BASE_IMAGE. Containers run with network none, so nothing else comes from outside.
#   4. fills a wheels directory ($HIL_CACHE/wheels) with the CPU torch wheel and the pure-Python
#      wheels the suites need (pytest, pytest-timeout, tabulate, hypothesis, torch's deps), which
#      the HIL runner copies into the image's build context (HIL_WHEELS).
# `stop` ends only the dockerd whose pid file ($HIL_DOCKER_PID) names a dockerd on our socket,
# then the containerd and shims it ran (found by their pid file / our containerd socket), never
# a system docker. The data root stays for the next start, which reuses its cached torch layer;
# `clean` removes it. Under vfs every image layer and every container is a full copy of the
# root filesystem: `nox -s tests` took the data root from 1.4 to 14.0 GB at its peak (sampled
# every 3 s), which a one-shot CI machine with less free disk did not survive; under overlay2 a
# layer holds only what its step changed.
# `driver` prints the storage driver `start` would pick, and why.
# Env: HIL_DOCKER_SOCK, HIL_DOCKER_STORAGE_DRIVER, HIL_DOCKER_LOG, HIL_DOCKER_ROOT,
#      HIL_DOCKER_EXEC_ROOT, HIL_DOCKER_PID, HIL_CACHE, HIL_BASE_IMAGE, HIL_TORCH_WHEEL,
#      DEBIAN_MIRROR.
set -euo pipefail

SOCK="${HIL_DOCKER_SOCK:-/run/hil-docker.sock}"
ROOT="${HIL_DOCKER_ROOT:-/var/lib/hil-docker}"
CACHE="${HIL_CACHE:-/var/cache/hil}"
BASE_IMAGE="${HIL_BASE_IMAGE:-hil-base:bookworm}"
TORCH_WHEEL="${HIL_TORCH_WHEEL:-/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
HOST="unix://${SOCK}"
EXEC_ROOT="${HIL_DOCKER_EXEC_ROOT:-/run/hil-docker}"
PIDFILE="${HIL_DOCKER_PID:-/run/hil-docker.pid}"
CONTAINERD_PIDFILE="$EXEC_ROOT/containerd/containerd.pid"
CONTAINERD_SOCK="$EXEC_ROOT/containerd/containerd.sock"
LOG="${HIL_DOCKER_LOG:-/var/log/hil-dockerd.log}"

say() { echo "[docker-engine] $*" >&2; }
dk() { docker -H "$HOST" "$@"; }

# the pid in pid file $1 if that process is alive and its command line contains $2
pid_of() {
    local pid
    pid="$(cat "$1" 2>/dev/null || true)"
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$2" || return 1
    echo "$pid"
}

# alive and not a zombie (an exited child its parent has not reaped yet counts as gone)
alive() {
    [ -r "/proc/$1/stat" ] || return 1
    [ "$(sed -E 's/.*\) (.).*/\1/' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

# TERM, wait up to $2 seconds, then KILL
end_pid() {
    local pid="$1" wait_s="$2"
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 "$((wait_s * 5))"); do
        alive "$pid" || return 0
        sleep 0.2
    done
    say "pid $pid still alive after ${wait_s} s: KILL"
    kill -KILL "$pid" 2>/dev/null || true
}

stop_engine() {
    local pid cpid
    if pid="$(pid_of "$PIDFILE" "$HOST")"; then
        say "stopping dockerd (pid $pid) on $HOST"
        # dockerd stops its containers and its managed containerd on TERM
        end_pid "$pid" 60
    else
        say "no dockerd of ours running (pid file $PIDFILE)"
    fi
    if cpid="$(pid_of "$CONTAINERD_PIDFILE" containerd)"; then
        say "stopping the containerd dockerd left behind (pid $cpid)"
        end_pid "$cpid" 30
    fi
    # shims of our containerd (their command line names our private containerd socket)
    for shim in $(pgrep -f -- "-address $CONTAINERD_SOCK" || true); do
        say "stopping containerd shim $shim"
        end_pid "$shim" 10
    done
    rm -f "$PIDFILE"
}

# 0 when overlayfs mounts with upper and work directories on the data root's filesystem and a
# write through it lands in the upper directory: what dockerd's overlay2 driver needs
overlay_works() {
    local d ok=1
    mkdir -p "$ROOT"
    d="$(mktemp -d "$ROOT/.overlay-probe.XXXXXX")" || return 1
    mkdir -p "$d/lower" "$d/upper" "$d/work" "$d/merged"
    echo lower >"$d/lower/f"
    if mount -t overlay overlay \
        -o "lowerdir=$d/lower,upperdir=$d/upper,workdir=$d/work" "$d/merged" 2>/dev/null; then
        if echo upper >"$d/merged/f" 2>/dev/null && [ "$(cat "$d/upper/f" 2>/dev/null)" = upper ]
        then ok=0; fi
        umount "$d/merged" 2>/dev/null || umount -l "$d/merged" 2>/dev/null || true
    fi
    rm -rf "$d"
    return "$ok"
}

# the storage driver for a new dockerd, and why, as "driver: reason"
pick_driver() {
    if [ -n "${HIL_DOCKER_STORAGE_DRIVER:-}" ]; then
        echo "$HIL_DOCKER_STORAGE_DRIVER: HIL_DOCKER_STORAGE_DRIVER"
    elif overlay_works; then
        echo "overlay2: overlayfs mounts on $ROOT"
    else
        echo "vfs: overlayfs does not mount on $ROOT (every layer will be a full copy)"
    fi
}

safe_rm() {  # refuse to delete / or an empty path, and unmount leftovers first
    local dir="$1"
    case "$dir" in "" | "/" | "/var" | "/var/lib" | "/var/cache" | "/run")
        say "refusing to delete '$dir'"; return 1 ;;
    esac
    [ -e "$dir" ] || { say "$dir already absent"; return 0; }
    # the directory itself too: dockerd bind-mounts its data root onto itself and leaves that
    # mount behind when it stops (seen here after a clean stop; rm then fails with EBUSY)
    awk -v d="$dir" '$2 == d || index($2, d "/") == 1 {print $2}' /proc/self/mounts | sort -r |
        while read -r m; do umount -l "$m" 2>/dev/null || true; done
    say "deleting $dir ($(du -sh "$dir" 2>/dev/null | cut -f1))"
    rm -rf "$dir"
}

if [ "$(id -u)" != 0 ]; then
    say "must run as root (it starts and stops dockerd, runs debootstrap)"
    exit 1
fi

case "${1:-start}" in
start) ;;
stop)
    stop_engine
    exit 0
    ;;
clean)
    stop_engine
    safe_rm "$ROOT"
    rm -rf "$EXEC_ROOT"
    if [ "${2:-}" = "--cache" ]; then safe_rm "$CACHE"; fi
    exit 0
    ;;
driver)
    pick_driver
    exit 0
    ;;
status)
    if pid="$(pid_of "$PIDFILE" "$HOST")"; then say "dockerd running (pid $pid) on $HOST"
    else say "dockerd not running"; fi
    du -sh "$ROOT" "$CACHE" 2>/dev/null || true
    exit 0
    ;;
*)
    say "unknown command '$1'; expected start, stop, clean [--cache], driver or status"
    exit 2
    ;;
esac

# 1. packages
if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
    say "installing docker.io and debootstrap with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends docker.io debootstrap >/dev/null
else
    say "dockerd and debootstrap already installed"
fi

# 2. the engine
# Start dockerd on storage driver $1 ($2: what to say about the choice); 0 once it answers.
start_dockerd() {
    local driver="$1" other pid
    # a data root left by the other driver: its layers are invisible to this one, dead weight
    for other in vfs overlay2; do
        if [ "$other" != "$driver" ] && [ -d "$ROOT/$other" ]; then
            say "removing the $other layers a previous engine left in $ROOT"
            safe_rm "$ROOT/$other"
            safe_rm "$ROOT/image/$other"
        fi
    done
    say "starting dockerd on $HOST (storage driver $2; no iptables, no bridge; log $LOG)"
    setsid dockerd \
        --host "$HOST" \
        --storage-driver "$driver" \
        --iptables=false --ip6tables=false --bridge=none \
        --data-root "$ROOT" \
        --exec-root "$EXEC_ROOT" \
        --pidfile "$PIDFILE" \
        >>"$LOG" 2>&1 </dev/null &
    pid=$!
    for _ in $(seq 1 60); do
        dk info >/dev/null 2>&1 && return 0
        alive "$pid" || return 1  # a dockerd that refuses its storage driver exits at once
        sleep 1
    done
    dk info >/dev/null 2>&1 && return 0
    end_pid "$pid" 30  # it never answered: not left running beside the next try
    return 1
}

if dk info >/dev/null 2>&1; then
    say "dockerd already answering on $HOST ($(dk info --format '{{.Driver}}') storage driver)"
else
    mkdir -p "$ROOT" "$EXEC_ROOT"
    choice="$(pick_driver)"
    driver="${choice%%:*}"
    if ! start_dockerd "$driver" "$choice"; then
        say "dockerd did not come up on $driver; last log lines:"
        tail -n 15 "$LOG" >&2
        # the probe mounts overlayfs, but dockerd's overlay2 also checks the backing filesystem
        # (d_type, nesting): then vfs, slower and larger, is still an engine
        if [ "$driver" = overlay2 ] && [ -z "${HIL_DOCKER_STORAGE_DRIVER:-}" ]; then
            stop_engine
            start_dockerd vfs "vfs: dockerd refused overlay2 on $ROOT" || {
                say "dockerd did not come up on vfs either; last log lines:"
                tail -n 30 "$LOG" >&2
                exit 1
            }
        else
            exit 1
        fi
    fi
    say "dockerd is up (pid $(cat "$PIDFILE")); stop it with: bash .ci/docker-engine.sh stop"
fi

# 3. the base image
mkdir -p "$CACHE"
if dk image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    say "base image $BASE_IMAGE already present"
else
    TARBALL="$CACHE/bookworm-minbase-python.tar"
    if [ ! -s "$TARBALL" ]; then
        ROOTFS="$(mktemp -d "$CACHE/rootfs.XXXXXX")"
        say "debootstrap bookworm minbase + python3 into $ROOTFS (a few minutes, once)"
        debootstrap --variant=minbase \
            --include=python3,python3-venv,python3-pip,python3-setuptools,python3-wheel \
            bookworm "$ROOTFS" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
            { tail -n 30 "$CACHE/debootstrap.log" >&2; exit 1; }
        # apt caches are dead weight in the base layer (in every layer copy, under vfs)
        rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
        tar -C "$ROOTFS" -cf "$TARBALL.part" .
        mv "$TARBALL.part" "$TARBALL"
        rm -rf "$ROOTFS"
    else
        say "using cached rootfs $TARBALL"
    fi
    say "docker import $TARBALL as $BASE_IMAGE"
    dk import --change 'CMD ["/bin/bash"]' "$TARBALL" "$BASE_IMAGE" >/dev/null
fi

# 4. wheels for the image build context (nothing is downloaded inside containers)
WHEELS="$CACHE/wheels"
WANT="$(basename "$TORCH_WHEEL") pytest pytest-timeout tabulate hypothesis"
mkdir -p "$WHEELS"
if [ -f "$WHEELS/.complete" ] && [ "$(cat "$WHEELS/.complete")" = "$WANT" ]; then
    say "wheels already in $WHEELS"
else
    say "collecting wheels into $WHEELS"
    cp -f "$TORCH_WHEEL" "$WHEELS/"
    python3 -m pip download --quiet --dest "$WHEELS" \
        --only-binary=:all: --python-version 3.11 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform any \
        "$WHEELS/$(basename "$TORCH_WHEEL")" pytest pytest-timeout tabulate hypothesis
    echo "$WANT" >"$WHEELS/.complete"
fi

say "done; use:"
echo "export DOCKER_HOST=$HOST"
echo "export HIL_WHEELS=$WHEELS"
echo "export HIL_BASE_IMAGE=$BASE_IMAGE"
