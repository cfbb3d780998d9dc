# Tinyshakespeare with GPT-2's BPE (50257 tokens) on a CPU: a small tied-head model, about 10 minutes
# on 2 cores (the 50257-way softmax dominates), val loss 4.94 on the full val split (results/scale, 4 × 128).
# Offline: TIKTOKEN_CACHE_DIR must hold tiktoken's GPT-2 files (see README).
out_dir = "out-shakespeare"
dataset = "shakespeare"
eval_interval = 250
eval_iters = 20
log_interval = 50
always_save_checkpoint = False

n_layer = 4
n_head = 4
n_embd = 128
block_size = 64
batch_size = 12
dropout = 0.0
bias = False
head = "tied"  # the 50257 x 128 embedding is most of the parameters: share it with the head

learning_rate = 1e-3
max_iters = 1000
lr_decay_iters = 1000
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 100
