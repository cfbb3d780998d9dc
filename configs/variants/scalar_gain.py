# Variant overlay: python train.py configs/shakespeare_char.py configs/variants/scalar_gain.py
out_dir = "out-scalar_gain"
norm_gain = "scalar"
