"""Ahead-of-time autodiff: VJP rules, the joint graph, the min-cut partitioner, autograd glue."""
