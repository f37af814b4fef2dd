"""One tree's native attention through the public API, for an A/B of two trees on one GPU.

    PYTHONPATH=<tree>/packages/attn-core/src python3 bench/api_ab.py TAG OUT.json

Decode (Qwen3.6's 24/4 heads, head 256, fp16, block 16) at 1 x 8K ... 1 x 256K, 8 x 100K and
64 x 8K: ``paged_decode(..., backend="native")`` captured in a CUDA graph and replayed (median of
three runs of 50 replays), with its error against the torch path. Prefill at 100K / 250K x 8192
/ 2048: ``paged_prefix_prefill(..., backend="native")`` eager (CUDA events, median of 5); two
split-heavy short chunks against the torch path. Run it once per tree (each builds its own
libraries: give each tree its own ATTN_CORE_NATIVE_CACHE or the same, the keys differ) and
compare the JSON; docs/benchmarks.md#native-layer-redesign shows one such run. Measures, never
asserts.
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import capture_graph, event_ms, median_time_s  # noqa: E402

import attn_core  # noqa: E402

dev = torch.device("cuda")
H, KVH, D, BS = 24, 4, 256, 16
K = 1024
torch.manual_seed(0)


def decode_case(batch, ctx):
    blocks_per = -(-ctx // BS)
    nb = batch * blocks_per + 1
    x = 8
    kc = torch.randn(nb, KVH, D // x, BS, x, dtype=torch.float16, device=dev)
    vc = torch.randn(nb, KVH, D, BS, dtype=torch.float16, device=dev)
    perm = torch.randperm(nb - 1, device=dev)[: batch * blocks_per].int()
    bt = perm.view(batch, blocks_per).contiguous()
    sl = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    q = torch.randn(batch, H, D, dtype=torch.float16, device=dev)
    return q, kc, vc, bt, sl


def graph_ms(fn, reps=50):
    g = capture_graph(fn, warmup=3)
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    return sorted(event_ms(g.replay, calls=reps) for _ in range(3))[1]


def eager_ms(fn, reps=5):
    return median_time_s(fn, dev, warmup=1, iters=reps) * 1e3


def prefill_case(ctx, n):
    nb = -(-(ctx + n) // BS) + 1
    x = 8
    kc = torch.randn(nb, KVH, D // x, BS, x, dtype=torch.float16, device=dev)
    vc = torch.randn(nb, KVH, D, BS, dtype=torch.float16, device=dev)
    bt = torch.randperm(nb - 1, device=dev)[: nb - 1].int().view(1, -1).contiguous()
    q = torch.randn(n, H, D, dtype=torch.float16, device=dev)
    k = torch.randn(n, KVH, D, dtype=torch.float16, device=dev)
    v = torch.randn(n, KVH, D, dtype=torch.float16, device=dev)
    qsl = torch.tensor([0, n], dtype=torch.int32, device=dev)
    sl = torch.tensor([ctx + n], dtype=torch.int32, device=dev)
    cl = torch.tensor([ctx], dtype=torch.int32, device=dev)
    return q, k, v, kc, vc, bt, qsl, sl, cl, n


def main():
    if len(sys.argv) != 3 or not torch.cuda.is_available():
        print("usage: api_ab.py TAG OUT.json (needs a CUDA device)", file=sys.stderr)
        sys.exit(2)
    tag, path = sys.argv[1], sys.argv[2]
    rows = []
    for batch, ctx in (
        (1, 8 * K),
        (1, 32 * K),
        (1, 100 * K),
        (1, 256 * K),
        (8, 100 * K),
        (64, 8 * K),
    ):
        q, kc, vc, bt, sl = decode_case(batch, ctx)
        out = torch.empty_like(q)
        fn = lambda: attn_core.paged_decode(q, kc, vc, bt, sl, ctx, out=out, backend="native")  # noqa
        fn()
        torch.cuda.synchronize()
        torch_out = attn_core.paged_decode(q, kc, vc, bt, sl, ctx, backend="torch")
        err = float((out.float() - torch_out.float()).abs().max())
        rows.append(
            {
                "tag": tag,
                "op": "decode",
                "shape": f"{batch}x{ctx}",
                "graph_ms": graph_ms(fn),
                "err_vs_torch": err,
            }
        )
        print(rows[-1], flush=True)
        del q, kc, vc, bt, sl, out
        torch.cuda.empty_cache()
    for ctx, n in ((100_000, 8192), (100_000, 2048), (250_000, 8192), (250_000, 2048)):
        c = prefill_case(ctx, n)
        out = torch.empty_like(c[0])
        fn = lambda: attn_core.paged_prefix_prefill(*c, out=out, backend="native")  # noqa
        ms = eager_ms(fn)
        rows.append({"tag": tag, "op": "prefill", "shape": f"{ctx}/{n}", "eager_ms": ms})
        print(rows[-1], flush=True)
        del c, out
        torch.cuda.empty_cache()
    # small split-heavy prefill check against the torch path (exercises the partials layout)
    for ctx, n in ((20_000, 16), (5000, 3)):
        c = prefill_case(ctx, n)
        got = attn_core.paged_prefix_prefill(*c, backend="native")
        want = attn_core.paged_prefix_prefill(*c, backend="torch")
        plan = attn_core.prefill_plan_for(
            attn_core.AttentionShape(H, KVH, D, BS, torch.float16),
            attn_core.PrefillLengths(n, ctx),
            dev,
            backend="native",
        )
        rows.append(
            {
                "tag": tag,
                "op": "prefill_check",
                "shape": f"{ctx}/{n}",
                "splits": plan.num_splits,
                "err_vs_torch": float((got.float() - want.float()).abs().max()),
                "finite": bool(torch.isfinite(got).all()),
            }
        )
        print(rows[-1], flush=True)
    json.dump(rows, open(path, "w"), indent=1)


if __name__ == "__main__":
    main()
