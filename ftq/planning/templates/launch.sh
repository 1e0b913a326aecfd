## launch.sh, as ftq.planning.render.launch_script fills it in: run the launch, log to train.log, then
## record its exit status atomically. The environment (CUDA_VISIBLE_DEVICES, secrets) comes from the
## launcher's process, never this file. Placeholders and ## notes as in job.sbatch.
#!/usr/bin/env bash
# Rendered by ftq; the launcher runs it in its own process group with the job's environment.
set -u
cd -- {{run_dir}} || exit 1
rm -f -- {{exit_status}}

# A cancel sends SIGTERM to the whole process group, so the launch gets it directly. This shell must
# outlive the launch to record how it ended: with a trap, bash lets the foreground launch finish,
# then runs the trap, and $? is still the launch's own status.
trap 'echo "ftq: SIGTERM received, waiting for the launch to stop" >&2' TERM INT
## The fetch step for a spec naming a hub model or dataset (render.fetch_lines): trainer.fetch downloads it once
## into HF_HUB_CACHE (its failure is the run's exit status), then the ranks load offline. Empty otherwise.
{{fetch}}
## PYTORCH_CUDA_ALLOC_CONF for cuda jobs (render.cuda_env_line): two lines, left out on CPU.
{{cuda_env}}
## The plan's decisions the trainer reads from its environment and the checks made on this host before the
## launch (render.plan_env_lines, render.local_check_lines); empty when none apply.
{{plan_env}}
{{checks}}
{{command}} \
  >> {{train_log}} 2>&1
status=$?

printf '%s\n' "$status" > .{{exit_status}}.tmp && mv -f -- .{{exit_status}}.tmp {{exit_status}}
exit "$status"
