"""Test-only launcher: `accelerate launch --config_file fsdp_*.yaml tests/fsdp_on_cpu.py SCRIPT ARGS...` runs SCRIPT
with accelerate's FSDP code path on CPU processes (gloo).

accelerate 1.15 turns an FSDP launch into FSDP only on accelerators: on CPU the processes become plain DDP
(`DistributedType.MULTI_CPU`), which `training/sharding.check_engine` refuses. torch's FSDP2 itself runs on CPU with
gloo, so this launcher lets accelerate take its FSDP branch there, nothing else changed: the sharding plan, Trainer's
sharded checkpoints, resume and the gathered export then run as they would on GPUs.
"""

import runpy
import sys

import accelerate.state as state
from accelerate.utils import DistributedType

_original_init = state.AcceleratorState.__init__


def _init(self, *args, fsdp_plugin=None, **kwargs):
    _original_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
    if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
        self.distributed_type = DistributedType.FSDP
        self.fsdp_plugin = fsdp_plugin
        state.PartialState._shared_state["distributed_type"] = DistributedType.FSDP


state.AcceleratorState.__init__ = _init
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
