# Variant overlay: python train.py configs/shakespeare_char.py configs/variants/tied_head.py
out_dir = "out-tied_head"
head = "tied"
