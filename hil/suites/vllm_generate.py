"""A short vLLM generation with a tiny random model, with and without engine-patch.

Usage: python vllm_generate.py --out DIR

Skips (exit 77) when vLLM is not in the image. Otherwise it writes a 2-layer Llama with random
weights (no downloads, no tokenizer: prompts are token ids) and generates 16 greedy tokens from
a 600-token prompt (past vLLM's 512-token V1/V2 switch) in two fresh processes: plugins as the
image configures them (engine-patch loaded) and ``VLLM_PLUGINS`` naming no plugin. Each must
produce its tokens; whether the two agree is recorded in OUT/vllm_generate.json (a random
model's near-ties may flip a greedy token, so agreement is reported, not required).
Writes OUT/vllm-generate.xml itself.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from xml.sax.saxutils import quoteattr

from suite_files import write_atomic

SKIP_EXIT = 77
PROMPT_LEN = 600
NEW_TOKENS = 16
NO_PLUGIN = "hil-no-such-plugin"  # VLLM_PLUGINS naming nothing installed loads no plugin

CHILD = r"""
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
llm = LLM(model=sys.argv[1], skip_tokenizer_init=True, enforce_eager=True, max_model_len=1024,
          gpu_memory_utilization=0.3, dtype="float16", seed=0)
prompt = TokensPrompt(prompt_token_ids=[(7 * i) % 500 + 3 for i in range(int(sys.argv[2]))])
params = SamplingParams(max_tokens=int(sys.argv[3]), temperature=0.0, detokenize=False)
out = llm.generate([prompt], params)[0].outputs[0].token_ids
print("HIL_TOKENS " + json.dumps(list(out)), flush=True)
"""


def write_tiny_model(path: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        torch_dtype="float16",
    )
    LlamaForCausalLM(config).half().save_pretrained(path)


def generate(model: Path, plugins: str | None) -> tuple:
    """(token ids or None, log text) from a fresh process."""
    env = dict(os.environ)
    if plugins is not None:
        env["VLLM_PLUGINS"] = plugins
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), str(PROMPT_LEN), str(NEW_TOKENS)],
        capture_output=True,
        text=True,
        env=env,
    )
    log = proc.stdout + proc.stderr
    for line in proc.stdout.splitlines():
        if line.startswith("HIL_TOKENS "):
            return json.loads(line.split(" ", 1)[1]), log
    return None, log


def junit(cases: list) -> str:
    body = []
    for name, ok, msg in cases:
        inner = "" if ok else f"<failure message={quoteattr(msg)}/>"
        body.append(
            f'<testcase classname="vllm-generate" name={quoteattr(name)}>{inner}</testcase>'
        )
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n<testsuites><testsuite name="vllm-generate">'
        + "".join(body)
        + "</testsuite></testsuites>\n"
    )


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if importlib.util.find_spec("vllm") is None:
        print("vLLM is not installed in this image: skipping the generation smoke test")
        return SKIP_EXIT
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny-llama"
        write_tiny_model(model)
        for label, plugins in (("with-plugin", None), ("without-plugin", NO_PLUGIN)):
            tokens, log = generate(model, plugins)
            write_atomic(args.out / f"vllm-{label}.log", log)
            print(f"{label}: {tokens}", flush=True)
            runs[label] = tokens
    cases = []
    for label, tokens in runs.items():
        ok = tokens is not None and len(tokens) == NEW_TOKENS
        cases.append((label, ok, f"no {NEW_TOKENS} tokens; see vllm-{label}.log"))
    a, b = runs["with-plugin"], runs["without-plugin"]
    agree = sum(x == y for x, y in zip(a, b, strict=False)) if a and b else 0
    write_atomic(
        args.out / "vllm_generate.json",
        json.dumps({"runs": runs, "agreeing_tokens": agree, "of": NEW_TOKENS}, indent=1),
    )
    write_atomic(args.out / "vllm-generate.xml", junit(cases))
    return 0 if all(ok for _, ok, _ in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
