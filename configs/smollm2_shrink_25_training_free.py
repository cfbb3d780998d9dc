# SmolLM2-135M → −25% parameters (m = 432, the head kept tied), training-free: the PCA map of 32,768
# calibration tokens, no gradient step.
#   python transform.py configs/smollm2_shrink_25_training_free.py --in_dir=out-smollm2 --out_dir=out-smollm2-m432-free
width = 432
kind = "pca"
tie_head = True
tie_keep = 32
block_size = 256
calib_batches = 8
calib_batch_size = 16
data_dir = "data/shakespeare_smollm2"
eval_reference = False  # the original's val loss is in results/; evaluating it again costs ~5 min on one core
