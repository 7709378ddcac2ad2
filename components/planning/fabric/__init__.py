"""The multi-node fabric: Ray, NCCL, RDMA."""
