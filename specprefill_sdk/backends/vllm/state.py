"""The model state that gives vLLM's V2 model runner per-request RoPE positions (imports vLLM).

vLLM's runner computes compact positions (0..K-1 for a K-token prompt); they address the KV cache
and stay as they are. This state's ``prepare_inputs`` returns a second ``positions`` tensor, which
the runner hands to ``model.forward`` in place of its own: only RoPE sees the original positions.
The pattern is the runner's M-RoPE state (``vllm/v1/worker/gpu/mm/rope.py``): a prefill position
table per request plus a decode delta, computed on the GPU by one kernel per step into a
persistent buffer (so CUDA graphs captured with that buffer replay correctly).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from vllm.triton_utils import tl, triton
from vllm.utils.torch_utils import async_tensor_h2d
from vllm.v1.worker.gpu.model_states.default import DefaultModelState

from ...errors import InvalidRequestError
from .layout import PositionLayout, has_layout
from .positions import PositionTable

__all__ = ["SpecPrefillModelState"]

logger = logging.getLogger(__name__)


class SpecPrefillModelState(DefaultModelState):
    """`DefaultModelState` plus original RoPE positions for requests that carry a layout.

    A request without layout keys in ``SamplingParams.extra_args`` gets vanilla positions, so
    compressed and uncompressed requests share batches. A layout that does not fit its request
    is logged and the request runs with vanilla positions (an exception here would stop the engine).
    """

    def __init__(self, vllm_config: Any, model: torch.nn.Module, encoder_cache: Any, device: torch.device) -> None:
        super().__init__(vllm_config, model, encoder_cache, device)
        if self.rope_state is not None:
            raise RuntimeError(
                f"specprefill: {type(model).__name__} uses multi-dimensional RoPE (M-RoPE); "
                "SpecPrefill positions support 1-D RoPE models only"
            )
        self.table = PositionTable(self.max_num_reqs)
        # One spare element, as in the runner's own buffers; the persistent address is what
        # CUDA graphs captured through `prepare_dummy_inputs` read at replay.
        self.positions = torch.zeros(self.max_num_tokens + 1, dtype=torch.int64, device=device)
        self.table_gpu = torch.zeros(self.table.capacity, dtype=torch.int32, device=device)
        self.offset_gpu = torch.zeros(self.max_num_reqs, dtype=torch.int64, device=device)
        self.length_gpu = torch.zeros(self.max_num_reqs, dtype=torch.int32, device=device)
        self.delta_gpu = torch.zeros(self.max_num_reqs, dtype=torch.int32, device=device)
        self.req_slots: dict[str, int] = {}
        self.compressed_requests = 0  # a counter for logs and the status probe
        logger.info(
            "specprefill: position state ready for %s (max %d requests, %d tokens per step)",
            type(model).__name__,
            self.max_num_reqs,
            self.max_num_tokens,
        )

    # ------------------------------------------------------------------ request lifecycle
    def add_request(self, req_index: int, new_req_data: Any) -> None:
        super().add_request(req_index, new_req_data)
        self.req_slots[new_req_data.req_id] = req_index
        params = new_req_data.sampling_params
        extra = params.extra_args if params is not None else None
        if extra is None or not has_layout(extra):
            self.table.set_dense(req_index)
            return
        prefill_ids = new_req_data.prefill_token_ids or new_req_data.prompt_token_ids or []
        try:
            layout = PositionLayout.from_extra_args(extra, num_tokens=new_req_data.prompt_len)
            if layout.n > self.max_model_len:
                raise InvalidRequestError(f"{layout.n} original positions exceed max_model_len {self.max_model_len}")
            positions = layout.prefill_positions(len(prefill_ids))
        except InvalidRequestError as exc:
            logger.error("specprefill: request %s runs with vanilla positions: %s", new_req_data.req_id, exc)
            self.table.set_dense(req_index)
            return
        max_tokens = params.max_tokens or 1
        if layout.max_position(max_tokens) >= self.max_model_len:
            # vLLM bounds K + outputs, not n + outputs: later positions are clamped by the kernel.
            logger.warning(
                "specprefill: request %s may decode past position %d (n=%d, max_tokens=%d); "
                "keep n + max_tokens <= max_model_len",
                new_req_data.req_id,
                self.max_model_len - 1,
                layout.n,
                max_tokens,
            )
        # A request resumed after preemption re-prefills its outputs: the table covers them too.
        self.table.set(req_index, positions, layout.delta)
        self.compressed_requests += 1

    def remove_request(self, req_id: str) -> None:
        super().remove_request(req_id)
        slot = self.req_slots.pop(req_id, None)
        if slot is not None:
            self.table.clear(slot)

    def apply_staged_writes(self) -> None:
        super().apply_staged_writes()
        writes = self.table.take_writes()
        if writes.empty:
            return
        if writes.grown:
            # Compaction rewrote every live row, so the old contents need no copy.
            self.table_gpu = torch.zeros(writes.capacity, dtype=torch.int32, device=self.device)
        if writes.indices.size:
            index = async_tensor_h2d(writes.indices, device=self.device, dtype=torch.int64)
            values = async_tensor_h2d(writes.values, device=self.device, dtype=torch.int32)
            self.table_gpu.index_copy_(0, index, values)
        if writes.meta_changed:
            async_tensor_h2d(self.table.offset.copy(), out=self.offset_gpu)
            async_tensor_h2d(self.table.length.copy(), out=self.length_gpu)
            async_tensor_h2d(self.table.delta.copy(), out=self.delta_gpu)

    # ------------------------------------------------------------------ inputs
    def prepare_inputs(self, input_batch: Any, req_states: Any) -> dict[str, Any]:
        inputs = dict(super().prepare_inputs(input_batch, req_states))
        num_reqs = int(input_batch.idx_mapping.shape[0])
        if num_reqs:
            _rope_positions_kernel[(num_reqs,)](
                self.positions,
                self.table_gpu,
                self.offset_gpu,
                self.length_gpu,
                self.delta_gpu,
                input_batch.idx_mapping,
                input_batch.query_start_loc,
                req_states.num_computed_tokens.gpu,
                self.max_model_len - 1,
                BLOCK_SIZE=1024,
            )
        inputs["positions"] = self.positions[: input_batch.num_tokens_after_padding]
        return inputs

    def prepare_dummy_inputs(self, num_reqs: int, num_tokens: int) -> dict[str, Any]:
        inputs = dict(super().prepare_dummy_inputs(num_reqs, num_tokens))
        inputs["positions"] = self.positions[:num_tokens]
        return inputs

    # ------------------------------------------------------------------ introspection
    def describe(self) -> dict[str, Any]:
        """A small status dict for `SpecPrefillWorkerExtension.specprefill_status`."""
        return {
            "state": type(self).__name__,
            "active_tables": self.table.active,
            "table_capacity": self.table.capacity,
            "compressed_requests": self.compressed_requests,
            "max_model_len": int(self.max_model_len),
        }

    def table_snapshot(self) -> dict[str, np.ndarray]:
        """Host copies of the per-slot metadata (for tests)."""
        return {
            "offset": self.table.offset.copy(),
            "length": self.table.length.copy(),
            "delta": self.table.delta.copy(),
        }


@triton.jit
def _rope_positions_kernel(  # type: ignore[no-untyped-def]
    positions_ptr,
    table_ptr,
    offset_ptr,
    length_ptr,
    delta_ptr,
    idx_mapping_ptr,
    query_start_loc_ptr,
    num_computed_tokens_ptr,
    max_position,
    BLOCK_SIZE: tl.constexpr,
):
    # One program per batch row; same arithmetic as positions.reference_rope_positions.
    row = tl.program_id(0)
    slot = tl.load(idx_mapping_ptr + row)
    start = tl.load(query_start_loc_ptr + row)
    end = tl.load(query_start_loc_ptr + row + 1)
    num_computed = tl.load(num_computed_tokens_ptr + slot).to(tl.int64)
    offset = tl.load(offset_ptr + slot).to(tl.int64)
    length = tl.load(length_ptr + slot).to(tl.int64)
    delta = tl.load(delta_ptr + slot).to(tl.int64)
    query_len = end - start
    for i in range(0, query_len, BLOCK_SIZE):
        block = i + tl.arange(0, BLOCK_SIZE)
        mask = block < query_len
        compact = num_computed + block
        in_table = compact < length
        looked_up = tl.load(table_ptr + offset + compact, mask=mask & in_table, other=0).to(tl.int64)
        pos = tl.where(in_table, looked_up, compact + delta)
        pos = tl.minimum(tl.maximum(pos, 0), max_position)
        tl.store(positions_ptr + start + block, pos, mask=mask)
