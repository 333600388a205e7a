# sourced by every script of this lease on the device (vLLM payload in /tmp/site, the project in /tmp/proj)
export PYTHONPATH=/tmp/site:/tmp/proj VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
export DO_NOT_TRACK=1 PYTHONUNBUFFERED=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export RES=${RES:-/tmp/res}
mkdir -p "$RES"
