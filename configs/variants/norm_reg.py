# Variant overlay: python train.py configs/shakespeare_char.py configs/variants/norm_reg.py
out_dir = "out-norm_reg"
norm_reg = 0.1
