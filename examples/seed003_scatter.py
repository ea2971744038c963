# ruff: noqa: I001, UP032 - the blog's code, kept as written
# Seed 003's scatter program, run on ringtorch: only the import of `dist` changed.
# The blog ran three docker containers on tcp://172.17.0.2:8991; here the three processes run
# on one host, so the address is 127.0.0.1 and --init_method can pick another port.
#
#   python examples/seed003_scatter.py --rank 0 --world_size 3 &
#   python examples/seed003_scatter.py --rank 1 --world_size 3 &
#   python examples/seed003_scatter.py --rank 2 --world_size 3
import torch
import argparse
import ringtorch.distributed as dist  # was: import torch.distributed as dist

weight = torch.zeros(1)
scatter_list = [torch.randn_like(weight) for i in range(3)]

def run(rank):
    """
    数据分发
    """
    if rank == 0:
        dist.scatter(weight, scatter_list, 0)
        print(scatter_list)
    else:
        dist.scatter(weight, [], 0)
        print('rank {} receiving data {} from -\
rank0'.format( rank, weight ))

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
