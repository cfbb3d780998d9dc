# OpenWebText with GPT-2's BPE on one GPU: GPT-2 small's shape (12 layers, context 1024, tied head,
# head size 64) at any width n_embd. The scale study's GPU setting trains d = 256 ... 1024 on it, every
# width on the same 655 M tokens (5000 iterations x 131,072 tokens). nanoGPT's full GPT-2 recipe runs
# 600,000 iterations of 491,520 tokens; this is a study budget, not a GPT-2 reproduction.
# Data first: python data/openwebtext/prepare.py (the hub's openwebtext, ~54 GB of disk).
out_dir = "out-openwebtext"
dataset = "openwebtext"
eval_interval = 1000
eval_iters = 200
log_interval = 50
always_save_checkpoint = False

n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
batch_size = 32
gradient_accumulation_steps = 4
dropout = 0.0
bias = False
head = "tied"

learning_rate = 6e-4
max_iters = 5000
lr_decay_iters = 5000
min_lr = 6e-5
beta2 = 0.95
weight_decay = 0.1
warmup_iters = 200
