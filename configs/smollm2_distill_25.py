# The recovery of the −25% shrink (the protocol's distill25): distill the shrunk SmolLM2-135M from the original,
# KL only (no labels), 384 AdamW steps of 1 × 256 tokens of the calibration text's train split (98,304 tokens),
# rate 1e-4 decayed to 1e-5 — results/real_model_distill's choice on dev, read on test in results/protocol.
# About 45 single-core minutes on CPU.
#   python finetune.py configs/smollm2_distill_25.py --in_dir=out-smollm2-m432-free --out_dir=out-smollm2-m432-kd
#       (the teacher is the transform's source model, read from its record; or --teacher_dir=out-smollm2)
distill = True
distill_alpha = 1.0
distill_temperature = 1.0
block_size = 256
batch_size = 1
max_iters = 384
lr_decay_iters = 384
learning_rate = 1e-4
min_lr = 1e-5
warmup_iters = 32
eval_interval = 192
eval_iters = 4
eval_seed = 0
eval_train = False
seed = 1337
log_interval = 64
data_dir = "data/shakespeare_smollm2"
