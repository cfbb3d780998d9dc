# SmolLM2-135M → −50% parameters (m = 288 of d = 576, the head kept tied). Not training-free: the PCA map, then
# T's free block and every norm's gain trained by 32 Adam steps on the KL to the original.
#   python transform.py configs/smollm2_shrink_50.py --in_dir=out-smollm2 --out_dir=out-smollm2-m288
width = 288
kind = "pca"
tie_head = True
tie_keep = 32
learn_steps = 32
learn_gain_lr = 1e-2
block_size = 256
calib_batches = 8
calib_batch_size = 16
data_dir = "data/shakespeare_smollm2"
eval_reference = False  # the original's val loss is in results/; evaluating it again costs ~5 min on one core
