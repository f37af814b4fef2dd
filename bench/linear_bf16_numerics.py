"""What 16-bit matrix-unit operands would cost the chunked Gated DeltaNet prefill in accuracy,
measured on the CPU before any kernel is written for them.

    python3 bench/linear_bf16_numerics.py [--tokens 1024,4096,16384] [--value-heads 2]
        [--out DIR]

The native pair computes every product in fp32 and meets the family's tolerances (outputs
3e-2 in bf16; the final state 1e-4, whatever the input dtype). FLA's Triton kernels, 5x faster
on the H100, feed the matrix unit 16-bit operands: W, U, the new values, the decayed keys, the
masked scores and the state itself are rounded to the input dtype before each product (fp32
sums). This script runs the same 64-token WY/UT algorithm twice in float32, once as the native
pair does and once with those operands rounded to bf16, on model-like inputs (bf16 q/k/v and
beta, g in [-5, 0], l2-normalised q/k, K = V = 128), and prints each one's error against the
float64 per-token recurrence (attn_core.reference) in the family's metric: the largest
absolute error over max(1, the largest reference value).

Beside them, the scale those errors are judged on: the float64 recurrence itself, run again
on its inputs moved by up to half an ulp of bf16 (and of fp16), which is how far apart two
inputs are that the dtype cannot tell apart. What that moves the state by is what the state
is worth in that dtype, whatever computes it. Measures, never asserts; ``--out`` gets the JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from _args import positive_int, positive_ints, writable_dir  # noqa: E402
from _timing import print_table, write_results  # noqa: E402

from attn_core.native.gated_delta import STATE_TOLERANCE, TOLERANCE, _err  # noqa: E402
from attn_core.reference import reference_gated_delta  # noqa: E402

CHUNK, HEAD = 64, 128


def _inputs(tokens: int, value_heads: int, seed: int) -> dict[str, torch.Tensor]:
    """One sequence, ``[1, T, HV, ...]``, a key head a value head (grouping does not change
    what is rounded)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).bfloat16()

    g = -torch.rand(1, tokens, value_heads, generator=gen).mul_(5.0).square_().div_(5.0)
    beta = torch.rand(1, tokens, value_heads, generator=gen).bfloat16()
    return {"q": randn(1, tokens, value_heads, HEAD), "k": randn(1, tokens, value_heads, HEAD),
            "v": randn(1, tokens, value_heads, HEAD), "g": g, "beta": beta}  # fmt: skip


SITES = ("qk", "wu", "state", "v_new", "scores", "kd")  # where a matrix unit rounds operands


def chunked(x: dict[str, torch.Tensor], rounded: frozenset, dtype: torch.dtype):
    """``(o [T, HV, V], final state [HV, K, V])`` of the 64-token WY/UT form in float32, the
    operands at each site of ``rounded`` (``SITES``: the normalised q and k, W and U, the state
    read by the products, the new values, the masked scores, the decayed keys) rounded to
    ``dtype`` before their products, as a 16-bit matrix unit would read them."""

    def rnd(site: str, t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).float() if site in rounded else t

    q, k, v = (x[n][0].float().transpose(0, 1) for n in ("q", "k", "v"))  # [HV, T, D]
    g, beta = (x[n][0].float().transpose(0, 1) for n in ("g", "beta"))  # [HV, T]
    hv, t, dk = q.shape
    q = rnd("qk", q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * dk**-0.5)
    k = rnd("qk", k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6))
    state = torch.zeros(hv, dk, v.shape[-1])
    out = torch.empty_like(v)
    eye = torch.eye(CHUNK)
    for c0 in range(0, t, CHUNK):
        n = min(CHUNK, t - c0)
        qc, kc, vc = q[:, c0 : c0 + n], k[:, c0 : c0 + n], v[:, c0 : c0 + n]
        cum = g[:, c0 : c0 + n].cumsum(-1)
        b = beta[:, c0 : c0 + n]
        lower = torch.ones(n, n).tril()
        decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(lower == 0, -torch.inf).exp()
        a = (b[..., None] * (kc @ kc.transpose(-1, -2)) * decay).tril(-1)
        inv = torch.linalg.solve_triangular(a + eye[:n, :n], eye[:n, :n].expand(hv, n, n),
                                            upper=False, unitriangular=True)  # fmt: skip
        w = rnd("wu", inv @ (kc * (b * cum.exp())[..., None]))
        u = rnd("wu", inv @ (vc * b[..., None]))
        read = rnd("state", state)
        v_new = u - w @ read
        v_read = rnd("v_new", v_new)
        scores = rnd("scores", (qc @ kc.transpose(-1, -2)) * decay)
        out[:, c0 : c0 + n] = (qc * cum.exp()[..., None]) @ read + scores @ v_read
        last = cum[:, -1:]
        kd = rnd("kd", kc * (last - cum).exp()[..., None])
        state = state * last.exp()[..., None] + kd.transpose(-1, -2) @ v_read
    return out.transpose(0, 1), state


# Half an ulp a dtype (relative): the most its rounding moves a value.
HALF_ULP = {torch.bfloat16: 2.0**-9, torch.float16: 2.0**-12}


def moved_inputs(x: dict[str, torch.Tensor], dtype: torch.dtype, seed: int):
    """``x`` in float64 with q, k, v and beta (the 16-bit tensors) each scaled by ``1 + e``,
    ``e`` uniform in +-``HALF_ULP[dtype]``: inputs that ``dtype`` would round to the same
    values, or nearly."""
    gen = torch.Generator().manual_seed(seed)
    moved = dict(x)
    for name in ("q", "k", "v", "beta"):
        t = x[name].double()
        e = torch.rand(t.shape, generator=gen, dtype=torch.float64).mul_(2).sub_(1)
        moved[name] = t * (1 + HALF_ULP[dtype] * e)
    return moved


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=positive_ints, default=[1024, 4096, 16384])
    ap.add_argument("--value-heads", type=positive_int, default=2)
    ap.add_argument("--out", type=writable_dir, default=None, help="folder for the JSON")
    args = ap.parse_args(argv)
    every = frozenset(SITES)
    forms = {
        "fp32 products (the native pair)": (frozenset(), torch.float32),
        "bf16 operands everywhere (FLA's)": (every, torch.bfloat16),
        "fp16 operands everywhere": (every, torch.float16),
        "bf16 W and U only": (frozenset({"wu"}), torch.bfloat16),
        "bf16 q and k only": (frozenset({"qk"}), torch.bfloat16),
        "bf16 q, k, W, U, scores; the state's read and update fp32": (
            every - {"kd", "v_new", "state"},
            torch.bfloat16,
        ),
    }
    rows = []
    for tokens in args.tokens:
        x = _inputs(tokens, args.value_heads, seed=tokens)
        want_o, want_s = reference_gated_delta(**x, use_qk_l2norm=True)
        for name, (rounded, dtype) in forms.items():
            o, s = chunked(x, rounded, dtype)
            rows.append({"tokens": tokens, "form": name, "output_err": _err(o, want_o[0]),
                         "state_err": _err(s, want_s[0])})  # fmt: skip
            print(rows[-1], flush=True)
        for dtype in HALF_ULP:
            o, s = reference_gated_delta(**moved_inputs(x, dtype, seed=tokens), use_qk_l2norm=True)
            name = f"float64 recurrence, inputs moved by half a {str(dtype)[6:]} ulp"
            rows.append({"tokens": tokens, "form": name, "output_err": _err(o, want_o[0]),
                         "state_err": _err(s, want_s[0])})  # fmt: skip
            print(rows[-1], flush=True)
    print(f"tolerances: output {TOLERANCE[torch.bfloat16]:.0e} (bf16), state {STATE_TOLERANCE:.0e}")
    print_table(rows, ["tokens", "form", "output_err", "state_err"])
    if args.out:
        print(write_results(args.out, "linear_bf16_numerics.json", {"rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
