"""Tensor parallelism (`--tensor-parallel-size N`): one engine's model split over N ranks by torch.distributed.

group.py owns the process group and its collectives, shard_plan.py which slice of every weight and head a rank owns,
layers.py the vocabulary-parallel embedding / head and the all-reduce after row-parallel linears, sharded_loader.py
reads a rank's slices from safetensors, leader.py and follower.py are rank 0 (the gRPC worker) and the other ranks,
launch.py starts them.
"""
