#!/usr/bin/env bash
# Rendered by ftq; the launcher runs it in its own process group with the job's environment.
set -u
cd -- /shared/ftq/runs/job_0123456789abcdef || exit 1
rm -f -- exit_status

# A cancel sends SIGTERM to the whole process group, so the launch gets it directly. This shell must
# outlive the launch to record how it ended: with a trap, bash lets the foreground launch finish,
# then runs the trap, and $? is still the launch's own status.
trap 'echo "ftq: SIGTERM received, waiting for the launch to stop" >&2' TERM INT
# The fetch step: hub models and datasets downloaded once, before the ranks start (train.log)
/opt/ftq/.venv/bin/python -m trainer.fetch --spec spec.json >> train.log 2>&1
status=$?
if [ "$status" -ne 0 ]; then
  printf '%s\n' "$status" > .exit_status.tmp && mv -f -- .exit_status.tmp exit_status
  exit "$status"
fi
export HF_HUB_OFFLINE=1
# Fewer fragmentation OOMs hours in (FTQ_CUDA_ALLOC_CONF); a value in the run's environment wins
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
# ZeRO++ hpZ: a 16-bit copy of the weights sharded within each node (gathers stay on NVLink)
export FTQ_ZERO_HPZ_PARTITION_SIZE=8
/opt/ftq/.venv/bin/python -m accelerate.commands.launch \
  --config_file /shared/ftq/runs/job_0123456789abcdef/accelerate_config.yaml \
  --num_processes 16 \
  --num_machines 2 \
  --main_process_port 23413 \
  -m trainer \
  --spec /shared/ftq/runs/job_0123456789abcdef/spec.json \
  --output_dir /shared/ftq/runs/job_0123456789abcdef \
  --process_group_timeout 7200 \
  >> train.log 2>&1
status=$?

printf '%s\n' "$status" > .exit_status.tmp && mv -f -- .exit_status.tmp exit_status
exit "$status"
