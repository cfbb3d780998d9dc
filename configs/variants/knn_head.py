# Variant overlay: python train.py configs/shakespeare_char.py configs/variants/knn_head.py
out_dir = "out-knn_head"
head = "knn"
