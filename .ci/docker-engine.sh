#!/usr/bin/env bash
# A private Docker engine for the HIL tests, with a base image built without any registry.
#
#   bash .ci/docker-engine.sh        # idempotent; prints the exports to use, last
#
# What it does (each step is skipped when already done):
#   1. apt-get installs Debian's docker.io and debootstrap.
#   2. starts dockerd as root on its own socket ($HIL_DOCKER_SOCK), vfs storage driver, no
#      iptables, no bridge, its own data-root / exec-root / pidfile, so it never touches a
#      system docker; waits until it answers.
#   3. debootstraps a minbase bookworm root filesystem with python3 (+ venv, pip, setuptools),
#      caches it as a tarball outside the repo ($HIL_CACHE) and `docker import`s it as
#      $HIL_BASE_IMAGE. Containers run with network none, so nothing else comes from outside.
#   4. fills a wheels directory ($HIL_CACHE/wheels) with the CPU torch wheel and the pure-Python
#      wheels the suites need (pytest, pytest-timeout, tabulate, hypothesis, torch's deps), which
#      the HIL runner copies into the image's build context (HIL_WHEELS).
# Env: HIL_DOCKER_SOCK, HIL_DOCKER_ROOT, HIL_CACHE, HIL_BASE_IMAGE, HIL_TORCH_WHEEL, DEBIAN_MIRROR.
set -euo pipefail

SOCK="${HIL_DOCKER_SOCK:-/run/hil-docker.sock}"
ROOT="${HIL_DOCKER_ROOT:-/var/lib/hil-docker}"
CACHE="${HIL_CACHE:-/var/cache/hil}"
BASE_IMAGE="${HIL_BASE_IMAGE:-hil-base:bookworm}"
TORCH_WHEEL="${HIL_TORCH_WHEEL:-/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
HOST="unix://${SOCK}"
LOG="/var/log/hil-dockerd.log"

say() { echo "[docker-engine] $*" >&2; }
dk() { docker -H "$HOST" "$@"; }

if [ "$(id -u)" != 0 ]; then
    say "must run as root (it starts dockerd and runs debootstrap)"
    exit 1
fi

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
if dk info >/dev/null 2>&1; then
    say "dockerd already answering on $HOST"
else
    mkdir -p "$ROOT" "/run/hil-docker"
    say "starting dockerd on $HOST (vfs, no iptables, no bridge; log $LOG)"
    setsid dockerd \
        --host "$HOST" \
        --storage-driver vfs \
        --iptables=false --ip6tables=false --bridge=none \
        --data-root "$ROOT" \
        --exec-root /run/hil-docker \
        --pidfile /run/hil-docker.pid \
        >>"$LOG" 2>&1 </dev/null &
    for _ in $(seq 1 60); do
        dk info >/dev/null 2>&1 && break
        sleep 1
    done
    if ! dk info >/dev/null 2>&1; then
        say "dockerd did not answer within 60 s; last log lines:"
        tail -n 30 "$LOG" >&2
        exit 1
    fi
    say "dockerd is up (pid $(cat /run/hil-docker.pid))"
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
        # apt caches are dead weight in every vfs layer copy
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
