# SmolLM2-135M → −25% parameters (m = 432 of d = 576, the head kept tied): the learned-map recipe (T and the norms'
# gains learned on the KL to the original; docs/findings.md says what it costs against distillation).
#   python fetch.py --what=smollm2 --out_dir=out-smollm2
#   python prepare.py --tokenizer_from=out-smollm2 --out_dir=data/shakespeare_smollm2
#   python transform.py configs/smollm2_shrink_25.py --in_dir=out-smollm2 --out_dir=out-smollm2-m432
# Not training-free: T starts as the PCA map of 32,768 calibration tokens, then T's free block and every norm's
# per-coordinate gain are trained by 16 Adam steps on the KL to the original (about 65 k token forward+backward
# passes; results/real_model_tied/table.md has its seconds). configs/smollm2_shrink_25_training_free.py is the
# same shrink with no gradient step. Chosen on tinyshakespeare's val split (see docs/findings.md).
width = 432
kind = "pca"
tie_head = True
tie_keep = 32  # the final norm's 32 most outlying coordinates kept as rows of T: the tie needs them
learn_steps = 16
learn_gain_lr = 1e-2
block_size = 256
calib_batches = 8
calib_batch_size = 16
data_dir = "data/shakespeare_smollm2"  # the calibration text: calibrate on text like the text to be served
eval_reference = False  # the original's val loss is in results/; evaluating it again costs ~5 min on one core
