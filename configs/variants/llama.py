# Variant overlay: python train.py configs/shakespeare_char.py configs/variants/llama.py
# The Llama family's block: pre-RMSNorm, SwiGLU, rotary positions, no biases, grouped-query attention (4 query heads
# share 2 key/value heads). configs/shakespeare_char.py has 6 heads; 4 divide its n_embd=384 too.
out_dir = "out-llama"
norm_type = "rmsnorm"
mlp = "swiglu"
pos = "rope"
bias = False
n_head = 4
n_kv_head = 2
