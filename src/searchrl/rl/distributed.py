"""Several training processes (`torchrun`), seen by the trainer through one small object.

`Dist` answers the questions a data-parallel step asks — which rank am I, what is the global sum
of this count, do all ranks agree to skip — with `torch.distributed` collectives, and with the
local answer when there is one process (`LOCAL`), so the single-process trainer runs the same
code. Every rank must call each method at the same point of the step: a collective one rank
skips waits forever.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from searchrl.errors import SearchRLError


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    sharded: bool = False  # launched by torchrun: the policy is sharded with FSDP2 (even on one rank)

    @property
    def main(self) -> bool:
        """Rank 0: the one process that logs, writes metrics and samples, and prints."""
        return self.rank == 0

    # -- reductions (in place on a copy; every rank gets the result) ------------------------------
    def sum(self, x: Tensor) -> Tensor:
        if not self.sharded:
            return x
        x = x.detach().clone()
        dist.all_reduce(x)
        return x

    def total(self, n: float) -> float:
        return float(self.sum(torch.tensor(float(n), dtype=torch.float64)))

    def max_count(self, n: int) -> int:
        """The largest `n` over ranks: how many passes each rank runs so the collectives match."""
        if not self.sharded:
            return n
        x = torch.tensor(n, dtype=torch.long)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return int(x)

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on any: a decision taken by all ranks together."""
        return self.max_count(int(flag)) > 0

    def moments(self, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:  # [B, T] -> (), ()
        """Token-weighted (mean, biased variance) over the policy tokens of every rank: the global
        statistics of Reinforce++ batch whitening (`losses.masked_whiten`)."""
        keep = mask.bool()
        s = self.sum(torch.stack([x[keep].sum().double(), (x[keep].double() ** 2).sum(), keep.sum().double()]))
        n = s[2].clamp(min=1)
        mean = s[0] / n
        var = (s[1] / n - mean**2).clamp(min=0)
        return mean.to(x.dtype), var.to(x.dtype)

    # -- objects ----------------------------------------------------------------------------------
    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank (pickled: small things only)."""
        if not self.sharded:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.sharded:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def scatter(self, objs: list[Any] | None) -> Any:
        """Rank 0's `objs[r]` on rank r (`objs`: one per rank on rank 0, ignored elsewhere)."""
        if not self.sharded:
            return objs[0]
        box: list[Any] = [None]
        dist.scatter_object_list(box, objs if self.main else None, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.sharded:
            dist.barrier()

    def rank_slice(self, items: list) -> list:
        """This rank's contiguous share of a global list (shares differ by one at most)."""
        n = len(items)
        return items[self.rank * n // self.world : (self.rank + 1) * n // self.world]


LOCAL = Dist()


def launched_by_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_distributed(device: str) -> tuple[Dist, str]:
    """(the process group's `Dist`, this rank's device) under torchrun; (`LOCAL`, `device`) else.

    One process per device: `cuda` becomes `cuda:LOCAL_RANK` with NCCL; on CPU, gloo.
    """
    if not launched_by_torchrun():
        return LOCAL, device
    local_rank = int(os.environ["LOCAL_RANK"])
    on_gpu = torch.device(device).type == "cuda"
    if on_gpu:
        if not torch.cuda.is_available():
            raise SearchRLError(f"device={device} but this rank sees no CUDA device; use device=cpu (gloo) or check CUDA_VISIBLE_DEVICES")
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    if not dist.is_initialized():
        dist.init_process_group("nccl" if on_gpu else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), local_rank, sharded=True), device


def close_distributed(d: Dist) -> None:
    if d.sharded and dist.is_initialized():
        dist.destroy_process_group()
