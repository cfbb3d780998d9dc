# Character-level tinyshakespeare on a CPU: nanoGPT's CPU recipe (4 layers x 128, context 64,
# batch 12, 2000 iterations). Time and val loss on 2 cores: see the README's Quick start.
# GPU: add configs/gpu.py for nanoGPT's 6 x 384 baby GPT.
out_dir = "out-shakespeare-char"
dataset = "shakespeare_char"
eval_interval = 250
eval_iters = 200
log_interval = 50
always_save_checkpoint = False  # the val set is small: keep the best model

n_layer = 4
n_head = 4
n_embd = 128
block_size = 64
batch_size = 12
dropout = 0.0
bias = False

learning_rate = 1e-3
max_iters = 2000
lr_decay_iters = 2000
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 100
