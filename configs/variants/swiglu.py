# Variant overlay: python train.py configs/shakespeare_char.py configs/variants/swiglu.py
out_dir = "out-swiglu"
mlp = "swiglu"
