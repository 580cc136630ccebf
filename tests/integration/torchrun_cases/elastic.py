"""Writes torch.distributed.is_torchelastic_launched() to --out-file."""

import argparse

import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--out-file", required=True)
with open(p.parse_args().out_file, "w") as f:
    f.write(str(dist.is_torchelastic_launched()))
