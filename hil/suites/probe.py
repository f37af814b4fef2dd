"""Health probe: a tiny computation on the target's device, checked against the CPU.

Usage: python probe.py [cpu|cuda]   (default: $HIL_DEVICE, else cpu)

Exit 0 when the device computed a 64x64 matmul plus a reduction correctly, 1 when it computed
something wrong or has no such device, and any hang is the host's watchdog's business (the
probe runs under a short timeout there). Prints one JSON line describing the device.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(device: str) -> int:
    t0 = time.monotonic()
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"ok": False, "why": "torch.cuda.is_available() is False"}))
        return 1
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 64, generator=g)
    b = torch.randn(64, 64, generator=g)
    want = (a.double() @ b.double()).sum(dim=1)
    got = (a.to(device) @ b.to(device)).sum(dim=1).double().cpu()
    if device == "cuda":
        torch.cuda.synchronize()
    err = float((got - want).abs().max())
    info = {
        "ok": err < 1e-2,
        "device": device,
        "name": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "max_abs_error": err,
        "seconds": round(time.monotonic() - t0, 3),
    }
    print(json.dumps(info), flush=True)
    return 0 if info["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("HIL_DEVICE", "cpu")))
