"""ftq's trainer: `accelerate launch -m trainer --spec spec.json --output_dir RUN_DIR`.

It reads the job spec the worker wrote (or train.py's flags, trainer/args.py), fine-tunes with TRL's
SFTTrainer (PEFT LoRA optional) under whatever strategy accelerate set up, and writes metrics.jsonl,
checkpoints/ and final/ into the run directory. Of ftq it imports the contract only (ftq.contract: the
spec, the run layout, error codes, the model card), never the service or the store.
"""
