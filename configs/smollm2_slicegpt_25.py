# SliceGPT's construction (Ashkboos et al., ICLR 2024) on SmolLM2-135M at −25% parameters, training-free: a PCA map
# per residual site with shortcut matrices (transform.py --porting=per_block), SliceGPT's own choices (sequential
# calibration, raw weighting, no vocabulary term), at m = 333 where its 60 shortcut matrices and untied head bring
# it to the tied map's 100.9 M parameters. Our port reproduces SliceGPT's own code (results/real_model: 4.0517
# against its 4.0441 at m = 432); the protocol (scripts/protocol.py) reads it on test, alone and distilled.
#   python transform.py configs/smollm2_slicegpt_25.py --in_dir=out-smollm2 --out_dir=out-smollm2-slicegpt25
width = 333
kind = "pca"
porting = "per_block"
sequential_calibration = True
calib_weighting = "raw"
calib_vocabulary = False
block_size = 256
calib_batches = 8
calib_batch_size = 16
data_dir = "data/shakespeare_smollm2"
eval_reference = False  # the original's val loss is in results/; evaluating it again costs ~5 min on one core
