"""The platform's native V1 decode reach, and whether its V2 works.

Parent side (:func:`v1_facts`, :func:`v1_reach`, :func:`run_probe`): each probe is a
subprocess of this file (``python device_facts_v1.py v1 CONTEXT`` / ``v2``) under a per-probe
timeout, in its own process group (killed whole). A probe's outcome is one of

- ``ok``: vLLM's compiled ``paged_attention_v1`` ran at that context and matched attn-core;
- ``refused``: it raised (a refusal is data: the kernel's shared-memory limit, say);
- ``wrong``: it returned, but the output is not finite or not attn-core's (a launch that
  silently did nothing leaves the NaN poison);
- ``crash``: the subprocess died without an answer; ``hang``: it passed the timeout;
- ``absent``: vLLM's ``_C`` op is not there (nothing to probe).

The reach is the longest context that is ``ok``, found by bisection on multiples of the block
size starting at the profile's prediction; a ``hang`` stops the bisection and is recorded.
Shape: Qwen3.6's attention (24 q heads, 4 kv heads, head 256, block 16, fp16), one sequence,
``seq_len == max_seq_len == context``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Optional

from device_facts_record import absent, measured

HEADS, KV_HEADS, HEAD, BLOCK = 24, 4, 256, 16
REL_TOL = 1e-2  # fp16 output against attn-core's fp32-accumulated result: ~1e-3 expected


# ---------------------------------------------------------------- child (inside the probe)
def _native(name: str):
    """(NativeOp, None) or (None, why absent)."""
    try:
        from vllm import _custom_ops as ops
    except Exception as exc:  # any import failure means "no vLLM ops here"
        return None, f"import vllm._custom_ops failed: {type(exc).__name__}: {exc}"
    from engine_patch.native import probe

    native = probe(name, ops)
    return (native, None) if native.present else (None, f"{name}: {native.detail}")


def _case(context: int):
    import torch

    g = torch.Generator(device="cuda").manual_seed(context)
    blocks = -(-context // BLOCK)
    rnd = lambda *shape: torch.randn(*shape, generator=g, device="cuda").half()  # noqa: E731
    key_cache = rnd(blocks + 1, KV_HEADS, HEAD // 8, BLOCK, 8)
    value_cache = rnd(blocks + 1, KV_HEADS, HEAD, BLOCK)
    perm = torch.randperm(blocks + 1, generator=g, device="cuda")[:blocks]
    tables = perm.to(torch.int32).view(1, blocks)
    seq_lens = torch.tensor([context], dtype=torch.int32, device="cuda")
    return rnd(1, HEADS, HEAD), key_cache, value_cache, tables, seq_lens


def child_v1(context: int) -> dict:
    import torch

    import attn_core
    from engine_patch.ops import head_mapping
    from engine_patch.signatures import VENDOR

    native, why = _native("paged_attention_v1")
    if native is None:
        return {"outcome": "absent", "detail": why}
    query, kc, vc, tables, seq_lens = _case(context)
    out = torch.full_like(query, float("nan"))
    scale = HEAD**-0.5
    common = (scale, tables, seq_lens, BLOCK, context, None, "auto")
    if native.flavour == VENDOR:
        args = (out, query, kc, vc, head_mapping(HEADS, KV_HEADS, query.device)) + common
    else:
        args = (out, query, kc, vc, KV_HEADS) + common + (1.0, 1.0, 0, 0, 0, 64, 0)
    try:
        native.fn(*args)
        torch.cuda.synchronize()
    except Exception as exc:  # the refusal is the datum
        return {"outcome": "refused", "detail": f"{type(exc).__name__}: {exc}"[:400]}
    want = attn_core.paged_decode(query, kc, vc, tables, seq_lens, context, scale).float()
    got = out.float()
    if not bool(torch.isfinite(got).all()):
        return {"outcome": "wrong", "detail": "output not finite (not written?)"}
    rel = float((got - want).norm() / want.norm().clamp_min(1e-30))
    outcome = "ok" if rel <= REL_TOL else "wrong"
    return {"outcome": outcome, "detail": f"relative error {rel:.2e} against attn-core",
            "flavour": native.flavour}  # fmt: skip


def child_v2() -> dict:
    import torch

    from engine_patch import native_v2

    native, why = _native("paged_attention_v2")
    if native is None:
        return {"outcome": "absent", "detail": why}
    ok, detail = native_v2.verified(native, torch.device("cuda"), torch.float16, HEAD, BLOCK)
    return {"outcome": "ok" if ok else "refused", "detail": detail, "flavour": native.flavour}


# ---------------------------------------------------------------- parent
def run_probe(args: list, timeout_s: float, python: str = sys.executable) -> dict:
    """One probe subprocess; its last stdout line is the answer."""
    t0 = time.monotonic()
    argv = [python, os.path.abspath(__file__), *map(str, args)]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"outcome": "hang", "detail": f"no answer in {timeout_s:g} s (HANG; killed)",
                "seconds": round(time.monotonic() - t0, 2)}  # fmt: skip
    # a child's output is anything a crashing driver prints: bytes that are not UTF-8, or
    # JSON nested past the parser's recursion limit are this probe's crash, nothing more
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    answer, unreadable = None, ""
    if proc.returncode == 0 and lines:
        try:
            answer = json.loads(lines[-1])
        except (ValueError, RecursionError) as exc:
            unreadable = f"answer unreadable ({type(exc).__name__}: {str(exc)[:100]})"
    if not isinstance(answer, dict) or not isinstance(answer.get("outcome"), str):
        tail = unreadable or (stderr.strip().splitlines() or ["no output"])[-1][:300]
        answer = {"outcome": "crash", "detail": f"exit {proc.returncode}: {tail}"}
    answer["seconds"] = round(time.monotonic() - t0, 2)
    return answer


def v1_reach(guess: int, cap: int, timeout_s: float, probe=None) -> dict:
    """{"reach": tokens or None, "first_failure": ..., "stopped": why or None, "probes": [...]}.

    ``probe(context) -> answer`` defaults to a subprocess; tests pass a fake one.
    """
    probe = probe or (lambda n: run_probe(["v1", n], timeout_s))
    probes: list = []

    def ok(n: int) -> Optional[bool]:
        try:
            answer = dict(probe(n), context=n)
        except Exception as exc:  # a bug in reading one probe is that probe's record only
            detail = f"the probe raised {type(exc).__name__}: {str(exc)[:200]}"
            answer = {"outcome": "crash", "detail": detail, "context": n}
        probes.append(answer)
        if answer["outcome"] in ("hang", "absent"):
            return None
        return answer["outcome"] == "ok"

    def done(reach, fail, stopped=None) -> dict:
        return {"reach": reach, "first_failure": fail, "stopped": stopped, "probes": probes}

    first = ok(BLOCK)
    if first is None:
        return done(None, None, probes[-1]["outcome"])
    if not first:
        return done(0, BLOCK)
    lo, hi = BLOCK, None
    n = min(max(BLOCK, guess // BLOCK * BLOCK), cap)
    while hi is None:  # grow from the guess until something fails (or the cap)
        if n <= lo:
            n = lo + BLOCK
        result = ok(n)
        if result is None:
            return done(lo, None, "hang")
        if result:
            lo = n
            if lo >= cap:
                return done(lo, None, f"accepted up to the cap ({cap})")
            n = lo + BLOCK if lo == guess else min(2 * lo, cap)
        else:
            hi = n
    while hi - lo > BLOCK:
        mid = (lo + hi) // 2 // BLOCK * BLOCK
        result = ok(mid)
        if result is None:
            return done(lo, hi, "hang")
        lo, hi = (mid, hi) if result else (lo, mid)
    return done(lo, hi)


def v1_facts(guess: int, cap: int, timeout_s: float) -> dict:
    """The ``native_v1_max_seq_len``, ``native_v1_probes`` and ``v2_probe`` facts, probing
    in subprocesses from ``guess`` (the profile's prediction) up to ``cap`` tokens."""
    r = v1_reach(guess, cap, timeout_s)
    probes = r["probes"]
    facts = {"native_v1_probes": measured(probes, "", "one subprocess per probe, "
                                          f"timeout {timeout_s:g} s")}  # fmt: skip
    if r["stopped"] == "absent":
        facts["native_v1_max_seq_len"] = absent("tokens", probes[-1]["detail"])
    elif r["reach"] is None:
        facts["native_v1_max_seq_len"] = absent(
            "tokens", f"HANG at context {probes[-1]['context']}"
        )
    else:
        fail = next((p for p in probes if p["context"] == r["first_failure"]), None)
        method = (
            "bisection on multiples of 16 from the profile's prediction "
            f"({guess}): vllm _custom_ops.paged_attention_v1 at 24 q / 4 kv heads, head 256, "
            "block 16, fp16, seq_len = max_seq_len, matched against attn-core"
        )
        if fail is not None:
            method += f"; {fail['context']} {fail['outcome']}: {fail['detail']}"
        if r["stopped"]:
            method += f"; stopped: {r['stopped']}"
            if r["stopped"] == "hang":
                method += f" (HANG at context {probes[-1]['context']})"
        facts["native_v1_max_seq_len"] = measured(r["reach"], "tokens", method)
    if r["stopped"] == "hang":
        facts["v2_probe"] = absent("", "not probed: a V1 probe hung (the device may be wedged)")
        return facts
    v2 = run_probe(["v2"], timeout_s)
    if v2["outcome"] == "absent":
        facts["v2_probe"] = absent("", v2["detail"])
    else:
        ok = v2["outcome"] == "ok"
        value = {"available": ok, "error": None if ok else f"{v2['outcome']}: {v2['detail']}"}
        facts["v2_probe"] = measured(value, "", "vllm _custom_ops.paged_attention_v2 on lengths "
                                     "1/600/1500 (8 q / 2 kv heads, head 256, block 16, fp16) "
                                     "against the float64 reference, in a subprocess")  # fmt: skip
    return facts


def main(argv: list) -> int:
    if argv[:1] == ["v1"] and len(argv) == 2:
        answer = child_v1(int(argv[1]))
    elif argv == ["v2"]:
        answer = child_v2()
    else:
        print(f"usage: {sys.argv[0]} v1 CONTEXT | v2, got {argv}", file=sys.stderr)
        return 2
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
