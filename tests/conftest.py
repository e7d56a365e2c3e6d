import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each xdist worker (and the processes it starts) gets one thread: two workers x two OpenMP threads on two cores
    # oversubscribe the CPU and slow recurrent layers down tenfold.
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
