# ruff: noqa: I001, UP032 - the blog's code, kept as written
# Seed 003's reduce program, run on ringtorch: only the import of `dist` changed.
# Start it like examples/seed003_scatter.py (three processes, --rank 0/1/2, --world_size 3).
# As in the blog, rank 0 asks for MAX and the others pass the default op (SUM); the root's
# op is the one applied, so rank 0 prints the largest of the three weights.
import torch
import argparse
import ringtorch.distributed as dist  # was: import torch.distributed as dist
weight = torch.zeros(1)
# gather_list = [torch.ones_like(weight) for i in range(3)]

def run(rank):
    global weight

    if rank == 0:
        dist.reduce(weight, 0, op=dist.ReduceOp.MAX)
        print(weight)
    else:
        weight = torch.randn(1)
        dist.reduce(weight, 0)
        print('rank {} sending data {} to rank 0'\
              .format( rank, weight ))

if __name__ == '__main__':
    parser = argparse.ArgumentParser()
    parser.add_argument('--rank', type=int, default=0)
    parser.add_argument('--world_size', type=int, default=2)
    parser.add_argument('--init_method', default='tcp://127.0.0.1:8991')
    args = parser.parse_args()
    dist.init_process_group(backend='gloo', \
                            init_method=args.init_method, \
                            rank=args.rank, \
                            world_size=args.world_size)
    run(dist.get_rank())
