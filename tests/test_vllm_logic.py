"""Pure logic of the vLLM plugin: layouts, salts, request encoding, position tables, positions per
step (chunked prefill, decode, preemption, mixed batches), device plans for tensor parallelism.

None of this imports vLLM; the GPU side (the Triton kernel, the engine) is exercised by
benchmarks/vllm_gpu.py on a GPU machine.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch

from specprefill_sdk.backends.vllm.layout import (
    KEY_N,
    KEY_POSITIONS,
    KEY_SPANS,
    KEY_VERSION,
    PositionLayout,
    encode_prompt,
    has_layout,
    vllm_completion_body,
)
from specprefill_sdk.backends.vllm.parallel import engine_in_process, plan_devices, rank_device
from specprefill_sdk.backends.vllm.plugin import (
    EXPLICIT_ARCHITECTURES,
    PLUGIN_SETTING,
    SUPPORTED_ARCHITECTURES,
    check_vllm,
    enable_stock_classes,
    plan_registration,
    register,
    registered,
    supported_architecture,
)
from specprefill_sdk.backends.vllm.positions import PositionTable, reference_rope_positions
from specprefill_sdk.errors import BackendUnavailableError, ContextTooLongError, InvalidRequestError
from specprefill_sdk.types import CompressedPrompt, Prompt, SamplingParams, Selection

# ---------------------------------------------------------------------------------------------- layouts


def test_layout_from_positions_merges_runs_and_round_trips():
    layout = PositionLayout.from_positions([0, 1, 2, 40, 41, 99], n=100)
    assert layout.spans == ((0, 3), (40, 42), (99, 100))
    assert layout.kept == 6 and layout.delta == 94 and not layout.is_dense
    wire = layout.to_extra_args()
    assert wire == {KEY_VERSION: 1, KEY_N: 100, KEY_SPANS: [0, 3, 40, 42, 99, 100]}
    assert all(isinstance(v, int) for v in wire[KEY_SPANS])  # flat ints: what vllm_xargs accepts
    assert PositionLayout.from_extra_args(wire, num_tokens=6) == layout
    as_positions = {KEY_N: 100, KEY_POSITIONS: [0, 1, 2, 40, 41, 99]}
    assert PositionLayout.from_extra_args(as_positions, num_tokens=6) == layout
    np.testing.assert_array_equal(layout.positions(), [0, 1, 2, 40, 41, 99])


def test_layout_accepts_json_floats_and_adjacent_spans():
    # JSON clients may send 3.0 for 3; other encoders may split a run in two.
    wire = {KEY_N: 10.0, KEY_SPANS: [0.0, 2, 2, 4, 7, 8]}
    layout = PositionLayout.from_extra_args(wire)
    assert layout.spans == ((0, 4), (7, 8)) and layout.n == 10


@pytest.mark.parametrize(
    ("wire", "num_tokens", "message"),
    [
        ({KEY_SPANS: [0, 3]}, None, "required"),
        ({KEY_N: 10}, None, "exactly one"),
        ({KEY_N: 10, KEY_SPANS: [0, 3], KEY_POSITIONS: [0, 1, 2]}, None, "exactly one"),
        ({KEY_N: 10, KEY_SPANS: [0, 3, 5]}, None, "pairs"),
        ({KEY_N: 10, KEY_SPANS: [5, 7, 0, 2]}, None, "sorted"),
        ({KEY_N: 10, KEY_SPANS: [0, 3, 2, 5]}, None, "sorted"),
        ({KEY_N: 10, KEY_SPANS: [0, 11]}, None, "exceeds"),
        ({KEY_N: 10, KEY_SPANS: [3, 3]}, None, "empty"),
        ({KEY_N: 10, KEY_POSITIONS: [0, 2, 2]}, None, "strictly increasing"),
        ({KEY_N: 10, KEY_POSITIONS: [-1, 2]}, None, "non-negative"),
        ({KEY_N: 10, KEY_POSITIONS: [0, 10]}, None, "below"),
        ({KEY_N: 10, KEY_POSITIONS: []}, None, "keeps no token"),
        ({KEY_N: 10, KEY_POSITIONS: [0, 1.5]}, None, "integers"),
        ({KEY_N: 10, KEY_POSITIONS: [0, True]}, None, "integers"),
        ({KEY_N: 10, KEY_POSITIONS: "0,1"}, None, "flat list"),
        ({KEY_N: "10", KEY_POSITIONS: [0]}, None, "integer"),
        ({KEY_N: 0, KEY_POSITIONS: [0]}, None, ">= 1"),
        ({KEY_VERSION: 2, KEY_N: 10, KEY_POSITIONS: [0]}, None, "unsupported"),
        ({KEY_N: 10, KEY_SPANS: [0, 3]}, 4, "places 3 tokens but the prompt has 4"),
    ],
)
def test_layout_rejects_malformed_wire_forms(wire, num_tokens, message):
    with pytest.raises(InvalidRequestError, match=message):
        PositionLayout.from_extra_args(wire, num_tokens=num_tokens)


def test_has_layout_only_for_specprefill_keys():
    assert not has_layout(None) and not has_layout({}) and not has_layout({"kv_transfer_params": {}})
    assert has_layout({KEY_N: 3}) and has_layout({KEY_SPANS: [0, 1]})


def test_prefill_positions_extend_with_the_delta_after_preemption():
    layout = PositionLayout.from_positions([0, 5, 6, 9], n=12)  # K = 4, delta = 8
    np.testing.assert_array_equal(layout.prefill_positions(4), [0, 5, 6, 9])
    # Resumed after 3 generated tokens: they sat at n, n+1, n+2.
    np.testing.assert_array_equal(layout.prefill_positions(7), [0, 5, 6, 9, 12, 13, 14])
    assert layout.max_position(max_tokens=5) == 16
    with pytest.raises(InvalidRequestError):
        layout.prefill_positions(3)


def test_cache_salt_is_stable_distinct_and_valid_for_vllm():
    a = PositionLayout.from_positions([0, 1, 5], n=8)
    same = PositionLayout.from_extra_args(a.to_extra_args())
    other_positions = PositionLayout.from_positions([0, 1, 6], n=8)
    other_n = PositionLayout.from_positions([0, 1, 5], n=9)
    assert a.cache_salt() == same.cache_salt()
    assert len({a.cache_salt(), other_positions.cache_salt(), other_n.cache_salt()}) == 3
    salt = a.cache_salt()
    # vLLM's rule for cache_salt: non-empty, <= 128 characters, none of '@', '/', '\\', NUL.
    assert 0 < len(salt) <= 128 and not set(salt) & {"@", "/", "\\", "\0"}


def _compressed(ids: list[int], keep: list[int]) -> CompressedPrompt:
    prompt = Prompt.from_token_ids(ids)
    selection = Selection(indices=tuple(keep), n=len(ids), protected=(False,) * len(keep))
    return CompressedPrompt.from_selection(prompt, selection)


def test_encode_prompt_dense_is_vanilla_and_compressed_carries_layout():
    ids = list(range(100, 120))
    dense_tokens, dense_extra = encode_prompt(CompressedPrompt.dense(Prompt.from_token_ids(ids)))
    assert dense_tokens == {"prompt_token_ids": ids} and dense_extra is None
    keep = [0, 1, 2, 3, 10, 11, 18, 19]
    tokens, extra = encode_prompt(_compressed(ids, keep))
    assert tokens["prompt_token_ids"] == [ids[i] for i in keep]
    assert extra is not None
    decoded = PositionLayout.from_extra_args(extra, num_tokens=len(tokens["prompt_token_ids"]))
    np.testing.assert_array_equal(decoded.positions(), keep)
    assert decoded.n == 20 and tokens["cache_salt"] == decoded.cache_salt()


def test_vllm_completion_body_matches_vllm_xargs_and_cache_salt_fields():
    ids = list(range(500, 540))
    keep = [0, 1, 2, 20, 21, 38, 39]
    body = vllm_completion_body(_compressed(ids, keep), SamplingParams(max_tokens=8, stop=("\n",), seed=3), "m")
    assert body["prompt"] == [ids[i] for i in keep] and body["model"] == "m"
    assert body["max_tokens"] == 8 and body["stop"] == ["\n"] and body["seed"] == 3
    # vLLM's request schema: vllm_xargs values are str | int | float | list of those (flat).
    for value in body["vllm_xargs"].values():
        assert isinstance(value, int | float | str) or all(isinstance(v, int) for v in value)
    layout = PositionLayout.from_extra_args(body["vllm_xargs"], num_tokens=len(keep))
    np.testing.assert_array_equal(layout.positions(), keep)
    assert body["cache_salt"] == layout.cache_salt()
    dense = vllm_completion_body(CompressedPrompt.dense(Prompt.from_token_ids(ids)), SamplingParams(), "m", stream=True)
    assert "vllm_xargs" not in dense and "cache_salt" not in dense and dense["stream"] is True


# ---------------------------------------------------------------------------------------------- tables


class DeviceCopy:
    """What the worker state keeps on the GPU, here as CPU tensors, fed by `TableWrites`."""

    def __init__(self, table: PositionTable) -> None:
        self.table = table
        self.buffer = torch.zeros(table.capacity, dtype=torch.int32)
        self.offset = torch.zeros(table.max_num_reqs, dtype=torch.int64)
        self.length = torch.zeros(table.max_num_reqs, dtype=torch.int32)
        self.delta = torch.zeros(table.max_num_reqs, dtype=torch.int32)

    def apply(self) -> None:
        writes = self.table.take_writes()
        if writes.grown:
            self.buffer = torch.zeros(writes.capacity, dtype=torch.int32)
        assert len(np.unique(writes.indices)) == writes.indices.size, "duplicate writes race on a GPU"
        self.buffer.index_copy_(0, torch.from_numpy(writes.indices), torch.from_numpy(writes.values))
        if writes.meta_changed:
            self.offset.copy_(torch.from_numpy(self.table.offset))
            self.length.copy_(torch.from_numpy(self.table.length))
            self.delta.copy_(torch.from_numpy(self.table.delta))

    def row(self, slot: int) -> np.ndarray:
        off, length = int(self.offset[slot]), int(self.length[slot])
        return self.buffer[off : off + length].numpy()


def test_table_rows_survive_compaction_and_growth():
    table = PositionTable(max_num_reqs=4, capacity=8)
    dev = DeviceCopy(table)
    rows = {0: np.array([0, 4, 5], np.int32), 1: np.array([1, 2, 7, 9], np.int32)}
    for slot, row in rows.items():
        table.set(slot, row, delta=3)
    dev.apply()
    table.clear(0)  # leaves a hole at the front
    rows.pop(0)
    rows[2] = np.array([10, 11, 12, 13, 14], np.int32)  # does not fit after slot 1: compaction
    table.set(2, rows[2], delta=1)
    dev.apply()
    assert table.capacity == 16  # 4 + 5 > 8: grown by doubling
    rows[3] = np.arange(20, 26, dtype=np.int32)
    table.set(3, rows[3], delta=0)
    dev.apply()
    for slot, row in rows.items():
        np.testing.assert_array_equal(dev.row(slot), row)
    assert int(dev.length[0]) == 0 and int(dev.delta[0]) == 0
    assert table.active == 3 and table.used == 15


def test_table_reused_slot_before_apply_has_no_overlapping_writes():
    table = PositionTable(max_num_reqs=2, capacity=32)
    dev = DeviceCopy(table)
    table.set(0, np.array([3, 4, 5], np.int32), delta=2)
    table.clear(0)  # finished in the same step it was added (say, aborted)
    table.set(0, np.array([7, 8], np.int32), delta=5)  # the slot is reused at the same offset
    dev.apply()
    np.testing.assert_array_equal(dev.row(0), [7, 8])
    assert int(dev.delta[0]) == 5


def test_table_rejects_bad_slots_and_empty_tables_give_vanilla_positions():
    table = PositionTable(max_num_reqs=2)
    with pytest.raises(IndexError):
        table.set(2, np.array([0], np.int32), delta=0)
    table.set(1, np.array([], np.int32), delta=0)
    assert table.row(1) is None and table.length[1] == 0


# ---------------------------------------------------------------------------------------------- positions per step


def _positions(
    dev: DeviceCopy, rows: list[tuple[int, int, int]], num_computed: dict[int, int], max_position: int = 10_000
) -> list[list[int]]:
    """Run the reference kernel for batch rows ``(slot, num_tokens, _)``; split its output per row."""
    slots = torch.tensor([r[0] for r in rows], dtype=torch.int64)
    counts = [r[1] for r in rows]
    qsl = torch.tensor([0, *np.cumsum(counts).tolist()], dtype=torch.int32)
    computed = torch.zeros(dev.table.max_num_reqs, dtype=torch.int32)
    for slot, value in num_computed.items():
        computed[slot] = value
    out = reference_rope_positions(
        dev.buffer,
        dev.offset,
        dev.length,
        dev.delta,
        slots,
        qsl,
        computed,
        num_tokens=sum(counts),
        max_position=max_position,
    )
    return [out[int(qsl[i]) : int(qsl[i + 1])].tolist() for i in range(len(rows))]


def test_mixed_batch_chunked_prefill_and_decode():
    table = PositionTable(max_num_reqs=4)
    dev = DeviceCopy(table)
    compressed = PositionLayout.from_positions([0, 1, 2, 3, 20, 21, 22, 23, 38, 39], n=40)
    table.set(0, compressed.prefill_positions(compressed.kept), compressed.delta)
    table.set_dense(1)
    other = PositionLayout.from_positions([0, 7, 8, 9], n=10)
    table.set(2, other.prefill_positions(other.kept), other.delta)
    dev.apply()
    # Step: slot 0 prefills its second chunk (compact 4..7), slot 1 (vanilla) prefills 3 tokens
    # from compact 5, slot 2 decodes its 3rd generated token (compact index 4 + 2 = 6).
    got = _positions(dev, [(0, 4, 0), (1, 3, 0), (2, 1, 0)], {0: 4, 1: 5, 2: 6})
    assert got == [[20, 21, 22, 23], [5, 6, 7], [12]]
    # A step whose chunk crosses the end of the table: the last prefill tokens, then a draft-free
    # decode position follows at n.
    got = _positions(dev, [(0, 3, 0)], {0: 8})
    assert got == [[38, 39, 40]]


def test_positions_are_clamped_to_the_rotary_range():
    table = PositionTable(max_num_reqs=1)
    dev = DeviceCopy(table)
    layout = PositionLayout.from_positions([0, 90], n=100)
    table.set(0, layout.prefill_positions(layout.kept), layout.delta)
    dev.apply()
    assert _positions(dev, [(0, 1, 0)], {0: 5}, max_position=99) == [[99]]  # 5 + 98 -> clamped


def _simulate(layout: PositionLayout, chunk: int, new_tokens: int, preempt_after: int | None) -> list[int]:
    """Positions that one request's tokens get, step by step, as the V2 runner would drive the state.

    Returns the RoPE position of every token written to the KV cache, in compact order, with a
    preemption (request removed, then re-added with prompt + outputs as its prefill) if asked.
    """
    table = PositionTable(max_num_reqs=2, capacity=4)  # tiny: forces growth on the way
    dev = DeviceCopy(table)
    kv_positions: list[int] = []
    outputs = 0
    prefill_len = layout.kept
    table.set(1, layout.prefill_positions(prefill_len), layout.delta)
    dev.apply()
    computed = 0
    while outputs < new_tokens:
        n_tok = min(chunk, prefill_len - computed) if computed < prefill_len else 1
        got = _positions(dev, [(1, n_tok, 0)], {1: computed})[0]
        # A preemption discards the KV cache: what was written is recomputed after resumption.
        kv_positions[computed:] = got
        computed += n_tok
        if computed >= prefill_len:
            outputs += 1  # the step that finishes the prefill (or a decode) samples a token
        if preempt_after is not None and outputs == preempt_after:
            preempt_after = None
            table.clear(1)
            dev.apply()
            prefill_len = layout.kept + outputs  # prompt + outputs so far are prefilled again
            table.set(1, layout.prefill_positions(prefill_len), layout.delta)
            dev.apply()
            computed = 0
    return kv_positions


@pytest.mark.parametrize("preempt_after", [None, 1, 3])
@pytest.mark.parametrize("chunk", [3, 64])
def test_request_positions_through_chunked_prefill_decode_and_preemption(chunk, preempt_after):
    layout = PositionLayout.from_positions([0, 1, 2, 10, 11, 12, 13, 30, 31, 40, 41], n=42)
    kv = _simulate(layout, chunk=chunk, new_tokens=6, preempt_after=preempt_after)
    # KV entries: the kept tokens at their original positions, then generated tokens at n, n+1, ...
    # (the last sampled token is not yet in the cache).
    expected = [0, 1, 2, 10, 11, 12, 13, 30, 31, 40, 41, 42, 43, 44, 45, 46]
    assert kv == expected


# ---------------------------------------------------------------------------------------------- tensor parallelism


def test_every_rank_builds_identical_tables_from_the_same_requests():
    # Each tensor-parallel rank runs its own state and sees the same scheduler output.
    events = [
        ("set", 0, [0, 5, 6], 4),
        ("set", 1, [1, 2], 8),
        ("clear", 0, None, 0),
        ("set", 2, [3, 9, 10, 11], 1),
        ("dense", 3, None, 0),
        ("set", 0, list(range(50, 70)), 2),
    ]
    ranks = [PositionTable(max_num_reqs=4, capacity=8) for _ in range(4)]
    copies = [DeviceCopy(t) for t in ranks]
    for kind, slot, row, delta in events:
        for table, dev in zip(ranks, copies, strict=True):
            if kind == "set":
                table.set(slot, np.array(row, np.int32), delta)
            elif kind == "clear":
                table.clear(slot)
            else:
                table.set_dense(slot)
            dev.apply()
    first = copies[0]
    for dev in copies[1:]:
        assert torch.equal(dev.offset, first.offset) and torch.equal(dev.delta, first.delta)
        for slot in range(4):
            np.testing.assert_array_equal(dev.row(slot), first.row(slot))


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_draft_takes_a_spare_gpu_when_there_is_one(tp):
    plan = plan_devices(tp, num_gpus=8, gpu_memory_gib=141, draft_memory_gib=6)
    assert plan.target_devices == tuple(range(tp)) and plan.tensor_parallel_size == tp
    if tp < 8:
        assert plan.draft_device == f"cuda:{tp}" and not plan.shares_gpu
        assert plan.gpu_memory_utilization == 0.90
    else:
        assert plan.draft_device == "cuda:0" and plan.shares_gpu
        assert plan.gpu_memory_utilization == 0.85  # floor((0.90 - 6/141) * 100) / 100


def test_shared_gpu_plans_room_for_the_draft_and_refuses_when_none_is_left():
    plan = plan_devices(2, num_gpus=2, gpu_memory_gib=80, draft_memory_gib=16)
    assert plan.draft_device == "cuda:0" and plan.shares_gpu and plan.gpu_memory_utilization == 0.70
    kept = plan_devices(1, num_gpus=1, gpu_memory_gib=141, draft_memory_gib=6, gpu_memory_utilization=0.5)
    assert kept.gpu_memory_utilization == 0.5
    with pytest.raises(BackendUnavailableError, match="no room"):
        plan_devices(1, num_gpus=1, gpu_memory_gib=40, draft_memory_gib=8, gpu_memory_utilization=0.9)
    with pytest.raises(BackendUnavailableError, match="leaves vLLM only"):
        plan_devices(1, num_gpus=1, gpu_memory_gib=24, draft_memory_gib=16)


def test_explicit_draft_devices_and_bad_requests():
    assert plan_devices(2, 4, draft_device="cuda:3").draft_device == "cuda:3"
    assert plan_devices(2, 4, draft_device="cuda:1").shares_gpu
    assert plan_devices(2, 2, draft_device="cpu").shares_gpu is False
    assert plan_devices(1, 1, draft_device="cuda").draft_device == "cuda:0"
    with pytest.raises(BackendUnavailableError, match="needs 4 GPUs"):
        plan_devices(4, num_gpus=2)
    with pytest.raises(BackendUnavailableError, match="not visible"):
        plan_devices(1, 1, draft_device="cuda:1")
    with pytest.raises(InvalidRequestError):
        plan_devices(1, 1, draft_device="tpu")
    with pytest.raises(InvalidRequestError):
        plan_devices(0, 1)
    assert [rank_device(r, 4, 4) for r in range(4)] == [0, 1, 2, 3]
    with pytest.raises(InvalidRequestError):
        rank_device(4, 4, 4)


# ---------------------------------------------------------------------------------------------- plugin


def test_supported_architectures_and_version_range():
    assert supported_architecture(["LlamaForCausalLM"]) == "LlamaForCausalLM"
    assert supported_architecture(["Qwen2ForCausalLM"]) == "Qwen2ForCausalLM"
    assert supported_architecture(["GemmaForCausalLM", EXPLICIT_ARCHITECTURES[0]]) == EXPLICIT_ARCHITECTURES[0]
    assert supported_architecture(["Gemma3ForCausalLM"]) is None
    assert check_vllm("0.33.0") is None and check_vllm("0.33.2rc1+cu130") is None
    assert "outside the supported range" in (check_vllm("0.32.1") or "")
    assert "outside the supported range" in (check_vllm("1.0.0") or "")


def _vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(_vllm_installed(), reason="checks the behaviour without vLLM")
def test_register_without_vllm_logs_and_never_raises(caplog):
    with caplog.at_level(logging.ERROR, logger="specprefill_sdk.backends.vllm.plugin"):
        register()
        register()  # idempotent, also when it cannot register
    assert not registered()
    assert "not installed" in caplog.text


@pytest.mark.parametrize(
    ("setting", "stock"),
    [
        (None, ()),
        ("", ()),
        ("1", tuple(SUPPORTED_ARCHITECTURES)),
        ("all", tuple(SUPPORTED_ARCHITECTURES)),
        ("LlamaForCausalLM", ("LlamaForCausalLM",)),
        (" Qwen2ForCausalLM , LlamaForCausalLM ", ("Qwen2ForCausalLM", "LlamaForCausalLM")),
    ],
)
def test_installing_the_plugin_replaces_no_stock_class_unless_asked(setting, stock):
    plan = plan_registration(setting)
    assert set(plan.replaces_stock) == set(stock)
    # The explicit names are new names: registering them replaces nothing vLLM serves.
    assert set(EXPLICIT_ARCHITECTURES) <= set(plan.names)
    assert set(plan.names) == set(EXPLICIT_ARCHITECTURES) | set(stock)
    assert plan.unknown == ()


def test_plugin_setting_off_and_unknown_names():
    assert plan_registration("0").names == {} and plan_registration("off").names == {}
    plan = plan_registration("LlamaForCausalLM,GemmaForCausalLM")
    assert plan.replaces_stock == ("LlamaForCausalLM",) and plan.unknown == ("GemmaForCausalLM",)


def test_backend_opts_in_for_its_engine_but_keeps_a_user_choice():
    env: dict[str, str] = {}
    assert enable_stock_classes(env) == "1" and env == {PLUGIN_SETTING: "1"}
    assert set(plan_registration(env[PLUGIN_SETTING]).replaces_stock) == set(SUPPORTED_ARCHITECTURES)
    for chosen in ("0", "Qwen2ForCausalLM"):
        env = {PLUGIN_SETTING: chosen}
        assert enable_stock_classes(env) == chosen and env == {PLUGIN_SETTING: chosen}


class _Registry:
    def __init__(self) -> None:
        self.models: dict[str, str] = {}

    def register_model(self, name: str, path: str) -> None:
        self.models[name] = path


def test_register_follows_the_setting_and_adds_names_later(monkeypatch):
    """`register` as vLLM calls it: a registry stands in for vLLM's, which cannot be imported here."""
    import types

    from specprefill_sdk.backends.vllm import plugin

    registry = _Registry()
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(ModelRegistry=registry))
    monkeypatch.setattr(plugin, "check_vllm", lambda: None)
    monkeypatch.setattr(plugin, "_runner_hook_missing", lambda: None)
    monkeypatch.setattr(plugin, "_registered", set())
    monkeypatch.delenv(PLUGIN_SETTING, raising=False)
    register()  # installed, nothing asked: new names only
    assert set(registry.models) == set(EXPLICIT_ARCHITECTURES)
    assert not set(registry.models) & set(SUPPORTED_ARCHITECTURES)
    monkeypatch.setenv(PLUGIN_SETTING, "1")  # as VLLMBackend does before it starts an engine
    register()
    assert set(registry.models) == set(EXPLICIT_ARCHITECTURES) | set(SUPPORTED_ARCHITECTURES)
    assert registry.models["LlamaForCausalLM"].endswith(":SpecPrefillLlamaForCausalLM")
    assert registered()


@pytest.mark.skipif(_vllm_installed(), reason="checks the behaviour without vLLM")
def test_backend_without_vllm_is_a_clear_error():
    from specprefill_sdk.backends.vllm import VLLMBackend

    with pytest.raises(BackendUnavailableError, match=r"specprefill-sdk\[vllm\]"):
        VLLMBackend("smollm2-135m")


def test_importing_the_package_does_not_import_vllm():
    code = (
        "import sys; import specprefill_sdk.backends.vllm as m; "
        "assert 'vllm' not in sys.modules, 'vllm imported'; print(m.VLLMBackend.__name__)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "VLLMBackend"


# ----------------------------------------------------------------------------- admission check
class _Params:
    """What vLLM's input processor hands `validate_params`: an object with ``extra_args``."""

    def __init__(self, extra_args):
        self.extra_args = extra_args


def test_layout_validator_rejects_malformed_layouts_at_admission():
    from specprefill_sdk.backends.vllm.layout import PositionLayout
    from specprefill_sdk.backends.vllm.validation import LayoutValidator, check_layout

    good = PositionLayout.from_positions([0, 1, 2, 7, 8, 20], 25).to_extra_args()
    LayoutValidator.validate_params(_Params(good))  # a valid layout passes
    LayoutValidator.validate_params(_Params(None))  # no layout: a vanilla request
    LayoutValidator.validate_params(_Params({"other_plugin": 1}))
    bad_cases = [
        {**good, KEY_SPANS: [*good[KEY_SPANS][:-1], -5]},  # what the HTTP check on the H200 sent
        {**good, KEY_SPANS: [0, 3, 2, 9]},  # overlapping runs
        {**good, KEY_N: 5},  # runs beyond n
        {**good, KEY_VERSION: 99},
        {KEY_SPANS: good[KEY_SPANS]},  # n missing
        {**good, KEY_POSITIONS: [0, 1]},  # both encodings
    ]
    for bad in bad_cases:
        with pytest.raises(ValueError, match="invalid SpecPrefill layout"):
            LayoutValidator.validate_params(_Params(bad))
        with pytest.raises(ValueError):
            check_layout(bad)
    proc = LayoutValidator(None, None)
    assert proc.add_request(0, _Params(good)) is False  # never changes logits
    logits = torch.zeros(2, 3)
    assert proc.apply(logits, None) is logits


class _Engine:
    """vLLM's ``LLMEngine`` as `_EngineDriver` drives it: each step adds one token to every unfinished request.

    ``on_token(rid, count)`` runs inside ``step``; ``fail_at`` makes the step that would reach it raise.
    """

    def __init__(self, length: int = 50, on_token: Any = None, fail_at: int | None = None) -> None:
        from types import SimpleNamespace

        self.namespace = SimpleNamespace
        self.length, self.on_token, self.fail_at = length, on_token, fail_at
        self.tokens: dict[str, list[int]] = {}
        self.aborted: list[str] = []
        self.step_threads: set[int] = set()
        self.steps = 0

    def add_request(self, rid: str, prompt: dict, params: object) -> None:
        if len(prompt.get("prompt_token_ids", ())) > 8:
            raise ValueError("the prompt is too long: 9 > max_model_len 8")
        self.tokens[rid] = []

    def has_unfinished_requests(self) -> bool:
        return bool(self.tokens)

    def step(self) -> list[Any]:
        self.step_threads.add(threading.get_ident())
        self.steps += 1
        outs = []
        for rid, tokens in list(self.tokens.items()):
            if self.fail_at is not None and len(tokens) + 1 == self.fail_at:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            tokens.append(len(tokens))
            if self.on_token is not None:
                self.on_token(rid, len(tokens))
            finished = len(tokens) >= self.length
            out = self.namespace(token_ids=list(tokens), text="", logprobs=None, finish_reason=None)
            outs.append(self.namespace(request_id=rid, outputs=[out], finished=finished))
            if finished:
                del self.tokens[rid]
        return outs

    def abort_request(self, rids: list[str]) -> None:
        self.aborted += rids
        for rid in rids:
            self.tokens.pop(rid, None)


@pytest.mark.parametrize("own_thread", [False, True], ids=["callers-step", "driver-thread-steps"])
def test_a_cancelled_request_stops_its_non_streaming_generation_and_is_aborted_in_the_engine(own_thread: bool) -> None:
    import contextvars

    from specprefill_sdk._cancel import REQUEST_CANCEL, GenerationStopped
    from specprefill_sdk.backends.vllm.backend import VLLMBackend, _EngineDriver
    from specprefill_sdk.types import CompressedPrompt, SamplingParams

    cancel = threading.Event()
    # the client leaves while the third token is made
    engine = _Engine(on_token=lambda rid, count: cancel.set() if count == 3 else None)
    backend = VLLMBackend.__new__(VLLMBackend)
    backend.llm = object()
    backend._driver = _EngineDriver(engine, own_thread=own_thread)
    backend.request = lambda prompt, params: ({}, None)  # type: ignore[method-assign]
    prompt = CompressedPrompt(token_ids=(1, 2, 3), position_ids=(0, 5, 9), n=10)
    ctx = contextvars.copy_context()
    ctx.run(REQUEST_CANCEL.set, cancel)
    try:
        with pytest.raises(GenerationStopped) as stopped:
            ctx.run(backend.generate, prompt, SamplingParams(max_tokens=50))
        _wait_for(lambda: len(engine.aborted) == 1)
        assert backend._driver.queues == {} and engine.tokens == {}
        if own_thread:  # the engine ran ahead of the caller, which stops at the first output it reads after
            assert 1 <= stopped.value.generated <= 3 < 50
        else:  # the caller stepped, and stopped at once
            assert stopped.value.generated == 3 and engine.steps == 3
    finally:
        backend._driver.close()


def _wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_the_driver_thread_alone_steps_an_in_process_engine_for_every_caller() -> None:
    """Requests from eight threads all get their whole output, and every step ran on one thread, not theirs."""
    from specprefill_sdk.backends.vllm.backend import _EngineDriver

    engine = _Engine(length=20)
    driver = _EngineDriver(engine, own_thread=True)
    results: dict[int, list[int]] = {}

    def call(i: int) -> None:
        rid = driver.submit({"prompt_token_ids": [i]}, None)
        while True:
            out = driver.next(rid)
            if out.finished:
                results[i] = out.outputs[0].token_ids
                driver.done(rid)
                return

    callers = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(30)
    driver.close()
    assert results == {i: list(range(20)) for i in range(8)}
    assert len(engine.step_threads) == 1
    assert engine.step_threads.isdisjoint({t.ident for t in callers} | {threading.get_ident()})
    assert driver.queues == {} and engine.tokens == {}


def test_the_driver_thread_reports_refusals_and_engine_failures_to_the_callers() -> None:
    from specprefill_sdk.backends.vllm.backend import _EngineDriver

    engine = _Engine(length=20, fail_at=5)
    driver = _EngineDriver(engine, own_thread=True)
    with pytest.raises(ContextTooLongError, match="too long"):
        driver.submit({"prompt_token_ids": list(range(9))}, None)
    assert driver.queues == {}
    rid = driver.submit({"prompt_token_ids": [1]}, None)
    seen = []
    with pytest.raises(BackendUnavailableError, match="the vLLM engine failed: CUDA error"):
        while True:
            seen.append(len(driver.next(rid).outputs[0].token_ids))
    assert seen == [1, 2, 3, 4]
    with pytest.raises(BackendUnavailableError, match="not running: CUDA error"):
        driver.submit({"prompt_token_ids": [1]}, None)
    driver.close()


def test_an_engine_that_fails_between_steps_releases_every_waiting_caller() -> None:
    """An abort the engine cannot do stops the thread; the other request's caller gets an error, not a hang."""
    from specprefill_sdk.backends.vllm.backend import _EngineDriver

    class Broken(_Engine):
        def abort_request(self, rids: list[str]) -> None:
            raise RuntimeError("the scheduler lost the request")

    driver = _EngineDriver(Broken(length=10_000), own_thread=True)
    left, stays = driver.submit({"prompt_token_ids": [1]}, None), driver.submit({"prompt_token_ids": [2]}, None)
    driver.next(left)
    driver.abort(left)
    with pytest.raises(BackendUnavailableError, match="the scheduler lost the request"):
        while True:
            driver.next(stays)
    with pytest.raises(BackendUnavailableError, match="not running"):
        driver.submit({"prompt_token_ids": [3]}, None)
    driver.close()


def test_closing_the_driver_stops_its_thread_and_releases_waiting_callers() -> None:
    from specprefill_sdk.backends.vllm.backend import _EngineDriver

    started = threading.Event()
    release = threading.Event()

    def slow(rid: str, count: int) -> None:  # the first step blocks until the test lets it go
        started.set()
        release.wait(10)

    engine = _Engine(length=1000, on_token=slow)
    driver = _EngineDriver(engine, own_thread=True)
    rid = driver.submit({"prompt_token_ids": [1]}, None)
    assert started.wait(10)
    closer = threading.Thread(target=driver.close)
    closer.start()
    release.set()
    closer.join(10)
    assert not closer.is_alive() and driver._thread is not None and not driver._thread.is_alive()
    with pytest.raises(BackendUnavailableError, match="closed"):
        while True:
            driver.next(rid)
    with pytest.raises(BackendUnavailableError, match="not running"):
        driver.submit({"prompt_token_ids": [1]}, None)


def test_the_engine_core_runs_beside_the_draft_only_where_they_share_one_rank_gpu() -> None:
    one = plan_devices(1, num_gpus=1, gpu_memory_gib=80, draft_memory_gib=8)
    spare = plan_devices(1, num_gpus=2)
    two = plan_devices(2, num_gpus=2, gpu_memory_gib=80, draft_memory_gib=8)
    cpu = plan_devices(1, num_gpus=1, draft_device="cpu")
    assert [engine_in_process("auto", p) for p in (one, spare, two, cpu)] == [True, False, False, False]
    assert engine_in_process("in-process", spare) and not engine_in_process("subprocess", one)
    with pytest.raises(InvalidRequestError, match="starts a process per rank"):
        engine_in_process("in-process", two)
    with pytest.raises(InvalidRequestError, match="must be one of auto, in-process, subprocess"):
        engine_in_process("inline", one)
