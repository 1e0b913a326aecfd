"""ftq's trainer: `accelerate launch -m trainer --spec spec.json --output_dir RUN_DIR`.

It reads the job spec the worker wrote (or the source articles' train.py flags), fine-tunes with TRL's
SFTTrainer (PEFT LoRA optional) under whatever strategy accelerate set up, and writes metrics.jsonl,
checkpoints/ and final/ into the run directory. It imports `ftq.contract.spec` and `ftq.contract.runs` only,
never the
service or the store.
"""
