# Overlay for one GPU: nanoGPT's "baby GPT" (6 layers x 384, context 256), val about 1.47 on one A100
# for shakespeare_char.  python train.py configs/shakespeare_char.py configs/gpu.py
out_dir = "out-shakespeare-char-gpu"
eval_iters = 200
log_interval = 10
n_layer = 6
n_head = 6
n_embd = 384
block_size = 256
batch_size = 64
dropout = 0.2
learning_rate = 1e-3
max_iters = 5000
lr_decay_iters = 5000
device = "cuda"
compile = True
