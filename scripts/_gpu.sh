# Shared by scripts/*.sh: which GPUs nvidia-smi sees, and whether one is SM90 (Hopper).
# Sets GPUS (one "name, compute capability" line per GPU; empty without nvidia-smi) and
# GPU_PROBLEM (empty when an SM90 GPU is visible, else why serving cannot run here).
GPUS="" GPU_PROBLEM=""
if ! command -v nvidia-smi >/dev/null 2>&1; then
  GPU_PROBLEM="no NVIDIA GPU found (no nvidia-smi on PATH)"
elif ! GPUS=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>&1); then
  GPU_PROBLEM="nvidia-smi failed: $(head -n 1 <<<"$GPUS")"
  GPUS=""
elif ! grep -Eq ',[[:space:]]*9\.[0-9]+[[:space:]]*$' <<<"$GPUS"; then
  GPU_PROBLEM="found $(sed -E 's/,[[:space:]]*([0-9.]+)[[:space:]]*$/ (compute capability \1)/' \
    <<<"$GPUS" | paste -sd ';' - | sed 's/;/; /g')"
fi
