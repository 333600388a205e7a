"""Per-request RoPE position tables for the vLLM worker, and the reference position computation.

This module needs only numpy and torch, so the bookkeeping runs (and is tested) without vLLM.

Every request slot of the model runner has three numbers: ``offset`` and ``length`` of its prefill
position table inside one flat int32 buffer, and ``delta``. For a token at compact index ``i``
(its place in the KV cache, which stays compact) the RoPE position is::

    table[offset + i]   if i < length      (a prefill token: its original position)
    i + delta           otherwise          (a generated token: n, n + 1, ...)

A request without a layout has ``length = 0`` and ``delta = 0``, i.e. vanilla positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["PositionTable", "TableWrites", "reference_rope_positions"]


@dataclass(frozen=True)
class TableWrites:
    """What the device copy of a `PositionTable` must apply before the next step.

    ``capacity`` is the flat buffer's size (a larger value than before means: allocate anew and
    rewrite). ``indices``/``values`` are element writes into the flat buffer. ``meta_changed``
    says whether ``offset``/``length``/``delta`` must be copied again.
    """

    capacity: int
    grown: bool
    indices: np.ndarray
    values: np.ndarray
    meta_changed: bool

    @property
    def empty(self) -> bool:
        return not self.grown and self.indices.size == 0 and not self.meta_changed


class PositionTable:
    """Host-side bookkeeping of position tables in one flat buffer (bump allocation, compaction).

    Example::

        table = PositionTable(max_num_reqs=4, capacity=16)
        table.set(0, np.array([0, 5, 9], dtype=np.int32), delta=7)   # n = 10, K = 3
        writes = table.take_writes()   # apply these to the device buffer
    """

    def __init__(self, max_num_reqs: int, capacity: int = 1 << 16) -> None:
        if max_num_reqs < 1 or capacity < 1:
            raise ValueError("max_num_reqs and capacity must be >= 1")
        self.max_num_reqs = max_num_reqs
        self.capacity = capacity
        self.offset = np.zeros(max_num_reqs, dtype=np.int64)
        self.length = np.zeros(max_num_reqs, dtype=np.int32)
        self.delta = np.zeros(max_num_reqs, dtype=np.int32)
        self._rows: dict[int, np.ndarray] = {}
        self._next_free = 0
        self._pending: list[tuple[int, np.ndarray]] = []
        self._grown = False
        self._meta_changed = False

    @property
    def active(self) -> int:
        """How many request slots hold a table (compressed requests in the runner)."""
        return len(self._rows)

    @property
    def used(self) -> int:
        """Elements held by live tables."""
        return sum(r.size for r in self._rows.values())

    def row(self, req_idx: int) -> np.ndarray | None:
        """The table of slot ``req_idx`` (None for a request without layout)."""
        return self._rows.get(req_idx)

    def set(self, req_idx: int, positions: np.ndarray, delta: int) -> None:
        """Give slot ``req_idx`` the prefill ``positions`` (int32) and the decode ``delta``."""
        self._check(req_idx)
        values = np.array(positions, dtype=np.int32).reshape(-1)  # a private copy: rows are told apart by identity
        self._drop(req_idx)
        if values.size == 0:
            self._set_meta(req_idx, 0, 0, delta)
            return
        if self._next_free + values.size > self.capacity:
            self._compact(extra=values.size)
        offset = self._next_free
        self._next_free += values.size
        self._rows[req_idx] = values
        self._pending.append((offset, values))
        self._set_meta(req_idx, offset, values.size, delta)

    def set_dense(self, req_idx: int) -> None:
        """Slot ``req_idx`` uses vanilla positions."""
        self._check(req_idx)
        self._drop(req_idx)
        self._set_meta(req_idx, 0, 0, 0)

    def clear(self, req_idx: int) -> None:
        """Free slot ``req_idx`` (the request finished or was preempted)."""
        self.set_dense(req_idx)

    def take_writes(self) -> TableWrites:
        """Collect and reset the pending device writes."""
        if self._pending:
            indices = np.concatenate([np.arange(o, o + v.size, dtype=np.int64) for o, v in self._pending])
            values = np.concatenate([v for _, v in self._pending])
        else:
            indices = np.zeros(0, dtype=np.int64)
            values = np.zeros(0, dtype=np.int32)
        writes = TableWrites(
            capacity=self.capacity, grown=self._grown, indices=indices, values=values, meta_changed=self._meta_changed
        )
        self._pending.clear()
        self._grown = False
        self._meta_changed = False
        return writes

    # ------------------------------------------------------------------ internals
    def _check(self, req_idx: int) -> None:
        if not 0 <= req_idx < self.max_num_reqs:
            raise IndexError(f"request slot {req_idx} outside [0, {self.max_num_reqs})")

    def _drop(self, req_idx: int) -> None:
        row = self._rows.pop(req_idx, None)
        if row is None:
            return
        # A write still pending for this row must not land on room that is handed out again.
        self._pending = [(o, v) for o, v in self._pending if v is not row]
        if int(self.offset[req_idx]) + row.size == self._next_free:
            self._next_free -= row.size  # the last row: give its room back at once
        if not self._rows:
            self._next_free = 0

    def _set_meta(self, req_idx: int, offset: int, length: int, delta: int) -> None:
        if (self.offset[req_idx], self.length[req_idx], self.delta[req_idx]) != (offset, length, delta):
            self.offset[req_idx] = offset
            self.length[req_idx] = length
            self.delta[req_idx] = delta
            self._meta_changed = True

    def _compact(self, extra: int) -> None:
        """Move live rows to the front (growing the buffer if needed) and rewrite them all."""
        need = self.used + extra
        if need > self.capacity:
            capacity = self.capacity
            while capacity < need:
                capacity *= 2
            self.capacity = capacity
            self._grown = True
        # Every live row is rewritten at its new offset; writes still pending are superseded.
        self._pending.clear()
        cursor = 0
        for req_idx in sorted(self._rows):
            row = self._rows[req_idx]
            self._pending.append((cursor, row))
            self._set_meta(req_idx, cursor, row.size, int(self.delta[req_idx]))
            cursor += row.size
        self._next_free = cursor


def reference_rope_positions(
    table: torch.Tensor,
    offset: torch.Tensor,
    length: torch.Tensor,
    delta: torch.Tensor,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    num_tokens: int,
    max_position: int,
) -> torch.Tensor:
    """RoPE positions of the ``num_tokens`` scheduled tokens (torch ops; any device).

    ``idx_mapping[b]`` is the request slot of batch row ``b``; its tokens are
    ``query_start_loc[b]:query_start_loc[b + 1]`` and start at compact index
    ``num_computed_tokens[slot]``. Positions are clamped to ``[0, max_position]``.
    """
    num_reqs = int(idx_mapping.shape[0])
    device = idx_mapping.device
    starts = query_start_loc[:num_reqs].long()
    counts = (query_start_loc[1 : num_reqs + 1] - query_start_loc[:num_reqs]).long()
    row = torch.repeat_interleave(torch.arange(num_reqs, device=device), counts, output_size=num_tokens)
    slot = idx_mapping.long()[row]
    token = torch.arange(num_tokens, device=device)
    compact = num_computed_tokens.long()[slot] + token - starts[row]
    in_table = compact < length.long()[slot]
    where = torch.where(in_table, offset.long()[slot] + compact, torch.zeros_like(compact))
    looked_up = table.long()[where] if table.numel() else torch.zeros_like(compact)
    positions = torch.where(in_table, looked_up, compact + delta.long()[slot])
    return positions.clamp_(0, max_position)
