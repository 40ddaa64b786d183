"""Seconds per policy version from the trainer's publish until a rollout worker process has loaded
it, with `rollout.weight_transport` file (a safetensors file in /dev/shm, read by the worker) and
broadcast (a gloo or nccl broadcast, received by the worker's thread), on one machine. The worker
holds the model in an `HFBackend` and loads each version with `load_weights`, as an async run's
worker does (docs/guides/async.md); each version is a new set of weights.

    python bench/weight_transport.py --model smollm2-135m --versions 5

Prints the trainer's publish seconds and the publish-to-loaded seconds of each transport (medians
over the versions after the first); last line: name=value pairs, ratios first.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def worker(model: str, device: str, group, folder: Path, versions: int, conn) -> None:
    from searchrl.assets import load_model
    from searchrl.rollout.config import RolloutConfig
    from searchrl.rollout.hf_backend import HFBackend
    from searchrl.rollout.weight_broadcast import Receiver
    from searchrl.rollout.worker_process import PublishedFiles

    backend = HFBackend(*load_model(model, device=device, dtype="float32"))
    published = Receiver(group, "127.0.0.1", device, RolloutConfig()) if group else PublishedFiles(folder)
    conn.send("ready")
    if group:
        published.start()
    for _ in range(versions):
        version = conn.recv()
        backend.load_weights(published.take(version))
        conn.send(time.perf_counter())  # CLOCK_MONOTONIC: the same clock in both processes


def measure(transport: str, model: str, device: str, versions: int) -> tuple[list[float], list[float]]:
    """(publish seconds, publish-to-loaded seconds) of each version."""
    import torch

    from searchrl.assets import load_model
    from searchrl.rollout.weight_broadcast import Sender
    from searchrl.rollout.weights import publish, retire, weights_bytes, weights_folder

    policy, _ = load_model(model, device=device, dtype="float32")
    folder = weights_folder(Path(tempfile.mkdtemp()), weights_bytes(policy) * 3)
    folder.mkdir(parents=True, exist_ok=True)
    sender = Sender(1, device, 300) if transport == "broadcast" else None
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    worker_device = "cuda:1" if device.startswith("cuda") else device  # NCCL: a GPU per process
    proc = ctx.Process(target=worker, args=(model, worker_device, sender.address(1, "127.0.0.1") if sender else None, folder,
                                            versions, theirs))
    proc.start()
    assert ours.recv() == "ready"
    if sender:
        sender.join()
    publishing, loaded = [], []
    for v in range(versions):
        with torch.no_grad():  # a new version: every weight changed
            for p in policy.parameters():
                p.add_(1e-3)
        t0 = time.perf_counter()
        if sender:
            sender.send(policy, v)
        else:
            publish(policy, folder, v)
        publishing.append(time.perf_counter() - t0)
        ours.send(v)
        loaded.append(ours.recv() - t0)
        if not sender and v > 0:
            retire(folder, v - 1)  # as the trainer does once no order needs it: the next publish reuses its pages
    proc.join(timeout=60)
    shutil.rmtree(folder, ignore_errors=True)
    return publishing, loaded


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-random", help="searchrl.assets name or folder (smollm2-135m: 540 MB float32)")
    ap.add_argument("--device", default="cpu", help="cpu (gloo), or cuda (nccl: the worker takes cuda:1)")
    ap.add_argument("--versions", type=int, default=5)
    args = ap.parse_args()
    out = {}
    for transport in ("file", "broadcast"):
        publishing, loaded = measure(transport, args.model, args.device, args.versions)
        later = slice(1, None) if args.versions > 1 else slice(None)
        out[transport] = (statistics.median(publishing[later]), statistics.median(loaded[later]))
        print(f"{transport}: publish {[round(t, 3) for t in publishing]} s, publish to loaded {[round(t, 3) for t in loaded]} s",
              flush=True)
    (fp, fl), (bp, bl) = out["file"], out["broadcast"]
    print(f"broadcast_vs_file_loaded={bl / fl:.3f} broadcast_vs_file_publish={bp / fp:.3f} file_publish_s={fp:.3f} "
          f"file_loaded_s={fl:.3f} broadcast_publish_s={bp:.3f} broadcast_loaded_s={bl:.3f}")


if __name__ == "__main__":
    main()
