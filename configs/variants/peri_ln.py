# Variant overlay: python train.py configs/shakespeare_char.py configs/variants/peri_ln.py
out_dir = "out-peri_ln"
norm_placement = "peri"
