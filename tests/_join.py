"""Joins the run that this process's launcher describes, as `keras-vit finetune DIR` joins it
(`own_images_processes.join`: JAX's processes, or TensorFlow's workers and their strategy), then prints
"process I of N: <process 0's host and pid>" (sent by process 0 to every process) and passes a barrier."""

import os
import socket

from keras_vit.recipes import finetune_devices, own_images_processes
from keras_vit.recipes.finetune_args import several_processes

index = own_images_processes.join(None)
sent = finetune_devices.first_process_value(lambda: f"{socket.gethostname()} {os.getpid()}")
finetune_devices.wait_for_every_process("the end")
print(f"process {index} of {several_processes()}: {sent}", flush=True)
