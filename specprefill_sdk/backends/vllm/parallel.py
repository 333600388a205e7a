"""Where the draft and the tensor-parallel target ranks run (pure logic; no vLLM, no GPU).

With tensor parallelism of size ``tp`` vLLM places rank ``r`` on visible GPU ``r``. The draft
scores each prompt once, in the calling process; the selection reaches every rank inside the
request (``SamplingParams.extra_args``), and each rank's model state builds the same position
table from it. So the only placement choice is the draft's device:

- a spare GPU (index ``tp``) when one is visible: vLLM keeps its memory share;
- otherwise rank 0's GPU: vLLM's ``gpu_memory_utilization`` (the same on every rank) is lowered
  so that the draft's weights and activations fit beside rank 0.

The second choice is where vLLM's engine core (scheduler and, with one rank, the model runner) runs:
in a process of its own (vLLM's default) or in the calling process. Two processes on one GPU take
turns on it; kernels of one process, on separate streams, can run at the same time. So when the
draft scores on the GPU of a single target rank, ``"auto"`` runs the engine core in the draft's
process, where the draft's compute-bound prefill can fill what the target's memory-bound decode
steps leave idle. With several ranks vLLM starts a process per rank whatever this choice says, so
``"auto"`` keeps its default there.

Example::

    plan = plan_devices(tensor_parallel_size=2, num_gpus=2, gpu_memory_gib=141, draft_memory_gib=6)
    plan.draft_device, plan.gpu_memory_utilization   # ('cuda:0', 0.85)
    engine_in_process("auto", plan)                  # False: two ranks
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import BackendUnavailableError, InvalidRequestError
from ...validation import check_rate

__all__ = ["DEFAULT_UTILIZATION", "ENGINE_CORES", "DevicePlan", "engine_in_process", "plan_devices", "rank_device"]

#: vLLM's share of each GPU when nothing else lives there.
DEFAULT_UTILIZATION = 0.90
#: Where vLLM's engine core may run (`engine_in_process`).
ENGINE_CORES = ("auto", "in-process", "subprocess")
#: Below this share a shared GPU leaves too little KV cache to be worth it.
MIN_UTILIZATION = 0.30


@dataclass(frozen=True)
class DevicePlan:
    """Target ranks' GPUs, the draft's device, and vLLM's memory share per GPU."""

    target_devices: tuple[int, ...]
    draft_device: str
    shares_gpu: bool
    gpu_memory_utilization: float

    @property
    def tensor_parallel_size(self) -> int:
        return len(self.target_devices)


def rank_device(rank: int, tensor_parallel_size: int, num_gpus: int) -> int:
    """The visible GPU index of tensor-parallel ``rank`` (vLLM's single-node placement)."""
    if not 0 <= rank < tensor_parallel_size:
        raise InvalidRequestError(f"rank {rank} outside [0, {tensor_parallel_size})", param="rank")
    if tensor_parallel_size > num_gpus:
        raise BackendUnavailableError(
            f"tensor_parallel_size={tensor_parallel_size} needs {tensor_parallel_size} GPUs, {num_gpus} visible"
        )
    return rank


def _parse_device(device: str) -> tuple[str, int | None]:
    if device == "cpu":
        return "cpu", None
    if device == "cuda":
        return "cuda", 0
    if device.startswith("cuda:") and device[5:].isdigit():
        return "cuda", int(device[5:])
    raise InvalidRequestError(
        f"draft device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}", param="draft_device"
    )


def plan_devices(
    tensor_parallel_size: int,
    num_gpus: int,
    *,
    draft_device: str = "auto",
    gpu_memory_gib: float | None = None,
    draft_memory_gib: float = 0.0,
    gpu_memory_utilization: float | None = None,
) -> DevicePlan:
    """Place the draft next to ``tensor_parallel_size`` target ranks on ``num_gpus`` GPUs.

    ``draft_memory_gib`` is what the draft needs on its GPU (weights plus scoring activations);
    with ``gpu_memory_gib`` it lowers vLLM's share when the draft shares a GPU with a rank. An
    explicit ``gpu_memory_utilization`` is kept as given (and checked to leave the draft room).

    Raises:
        BackendUnavailableError: too few GPUs, or no room for the draft beside a rank.
        InvalidRequestError: a malformed argument.
    """
    if tensor_parallel_size < 1:
        raise InvalidRequestError("tensor_parallel_size must be >= 1", param="tensor_parallel_size")
    if num_gpus < tensor_parallel_size:
        raise BackendUnavailableError(
            f"tensor_parallel_size={tensor_parallel_size} needs {tensor_parallel_size} GPUs, {num_gpus} visible"
        )
    if gpu_memory_utilization is not None:
        check_rate(gpu_memory_utilization, "gpu_memory_utilization", param="gpu_memory_utilization")
    targets = tuple(rank_device(r, tensor_parallel_size, num_gpus) for r in range(tensor_parallel_size))
    if draft_device == "auto":
        draft = f"cuda:{tensor_parallel_size}" if num_gpus > tensor_parallel_size else "cuda:0"
    else:
        kind, index = _parse_device(draft_device)
        if kind == "cuda" and index is not None and index >= num_gpus:
            raise BackendUnavailableError(f"draft device {draft_device} is not visible ({num_gpus} GPUs)")
        draft = "cpu" if kind == "cpu" else f"cuda:{index}"
    shares = draft.startswith("cuda:") and int(draft[5:]) in targets
    if not shares:
        return DevicePlan(targets, draft, False, gpu_memory_utilization or DEFAULT_UTILIZATION)
    reserve = draft_memory_gib / gpu_memory_gib if gpu_memory_gib else 0.0
    ceiling = DEFAULT_UTILIZATION - reserve
    if gpu_memory_utilization is None:
        utilization = math.floor(ceiling * 100) / 100
    else:
        utilization = gpu_memory_utilization
        if utilization > 1.0 - reserve + 1e-9:
            raise BackendUnavailableError(
                f"gpu_memory_utilization={utilization} leaves no room for the draft "
                f"({draft_memory_gib:.1f} GiB) on {draft}"
            )
    if gpu_memory_utilization is None and utilization < MIN_UTILIZATION:
        raise BackendUnavailableError(
            f"the draft ({draft_memory_gib:.1f} GiB) leaves vLLM only {utilization:.2f} of {draft}; "
            "give the draft its own GPU or a smaller draft"
        )
    return DevicePlan(targets, draft, True, utilization)


def engine_in_process(choice: str, plan: DevicePlan) -> bool:
    """Whether vLLM's engine core runs in the calling process, for ``choice`` in `ENGINE_CORES`.

    ``"auto"``: in this process when one rank shares its GPU with the draft (see the module's
    docstring); ``"in-process"`` needs a single rank (vLLM runs several in processes of their own).

    Raises:
        InvalidRequestError: an unknown choice, or ``"in-process"`` with several ranks.
    """
    if choice not in ENGINE_CORES:
        raise InvalidRequestError(
            f"engine_core must be one of {', '.join(ENGINE_CORES)}, got {choice!r}", param="engine_core"
        )
    if choice == "auto":
        return plan.tensor_parallel_size == 1 and plan.shares_gpu
    if choice == "in-process" and plan.tensor_parallel_size > 1:
        raise InvalidRequestError(
            f"engine_core='in-process' runs one rank; tensor_parallel_size={plan.tensor_parallel_size} "
            "starts a process per rank",
            param="engine_core",
        )
    return choice == "in-process"
