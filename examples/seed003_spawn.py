# ruff: noqa: I001, UP032 - the blog's code, kept as written
# Seed 003's closing variant: no containers, mp.spawn starts the three processes.
# Only the imports changed (ringtorch.multiprocessing, ringtorch.distributed); the blog leaves
# `f` to the reader: here it joins the group and runs the scatter program's `run`.
#
#   python examples/seed003_spawn.py
import torch
import argparse
import ringtorch.distributed as dist  # was: import torch.distributed as dist
import ringtorch.multiprocessing as mp  # was: import torch.multiprocessing as mp

weight = torch.zeros(1)
scatter_list = [torch.randn_like(weight) for i in range(3)]

def run(rank):
    if rank == 0:
        dist.scatter(weight, scatter_list, 0)
        print(scatter_list)
    else:
        dist.scatter(weight, [], 0)
        print('rank {} receiving data {} from rank0'.format( rank, weight ))

def f(rank, init_method):
    dist.init_process_group(backend='gloo', init_method=init_method, rank=rank, world_size=3)
    run(dist.get_rank())

if __name__ == '__main__':
    parser = argparse.ArgumentParser()
    parser.add_argument('--init_method', default='tcp://127.0.0.1:8991')
    args = parser.parse_args()
    mp.spawn(f, nprocs=3, args=(args.init_method,))
