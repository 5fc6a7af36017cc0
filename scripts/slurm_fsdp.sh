#!/bin/bash
# Multi-node StarPO with FSDP2 under SLURM: one task per GPU, Lightning reads the SLURM environment
# (SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID, SLURM_NODELIST) and builds the process group itself.
#   sbatch scripts/slurm_fsdp.sh configs/sokoban_starpo.yaml configs/models/qwen2.5-3b-instruct.yaml
# --trainer.num_nodes and --trainer.devices must match --nodes and --ntasks-per-node below; --data.training.num_groups and
# --data.validation.num_groups must be divisible by nodes x GPUs per node. Swap configs/fsdp.yaml for configs/ddp.yaml to
# replicate instead of shard.
#SBATCH --job-name=starpo-fsdp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --output=slurm-%j.out
set -euo pipefail
TASK=${1:?usage: sbatch scripts/slurm_fsdp.sh <task.yaml> [model overlay.yaml]}
MODEL=${2:-}
NODES=${SLURM_JOB_NUM_NODES:-2}
GPUS=${SLURM_NTASKS_PER_NODE:-8}
ARGS=(fit --config "$TASK")
[ -n "$MODEL" ] && ARGS+=(--config "$MODEL")
ARGS+=(--config configs/fsdp.yaml --trainer.accelerator gpu --trainer.num_nodes "$NODES" --trainer.devices "$GPUS")
srun python main.py "${ARGS[@]}"
