# ruff: noqa: I001, UP032 - the blog's code, kept as written
# Seed 003's gather program, run on ringtorch: only the import of `dist` changed.
# Start it like examples/seed003_scatter.py (three processes, --rank 0/1/2, --world_size 3).
import torch
import argparse
import ringtorch.distributed as dist  # was: import torch.distributed as dist
weight = torch.zeros(1)
gather_list = [torch.ones_like(weight) for i in range(3)]

def run(rank):
    global weight

    if rank == 0:
        dist.gather(weight, gather_list, 0)
        print(gather_list)
    else:
        weight = torch.randn(1)
        dist.gather(weight)
        print('rank {} is sending data {} to rank 0'\
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
