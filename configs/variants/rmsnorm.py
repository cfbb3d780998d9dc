# Variant overlay: python train.py configs/shakespeare_char.py configs/variants/rmsnorm.py
out_dir = "out-rmsnorm"
norm_type = "rmsnorm"
