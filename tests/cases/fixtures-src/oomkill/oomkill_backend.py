"""A PEP 517 backend whose wheel build dies the way an nvcc job does under the OOM killer."""

import os
import signal


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    print("compiling csrc/flash_fwd_hdim256_bf16_sm120.cu (pretend)", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
