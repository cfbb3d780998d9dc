# Variant overlay: python train.py configs/shakespeare_char.py configs/variants/no_gain.py
out_dir = "out-no_gain"
norm_gain = "none"
