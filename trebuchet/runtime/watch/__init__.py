"""What watches a run: metrics, activity and progress, ETA, hangs, stacks, GPUs, log policies."""
