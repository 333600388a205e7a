# sourced by every job script on the device
export PYTHONPATH=/tmp/site:/tmp/proj HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}
export RES=${RES:-/tmp/res}
MODEL=/tmp/qwen15.gguf
DRAFT=/tmp/qwen05.gguf
mkdir -p "$RES"
