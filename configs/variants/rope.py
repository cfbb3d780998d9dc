# Variant overlay: python train.py configs/shakespeare_char.py configs/variants/rope.py
out_dir = "out-rope"
pos = "rope"
