"""Checkpoints: the format and its COMPLETE marker, capture, write, load, the bucket side, resume, the uploader.

train.py talks to this room through `checkpointer.Checkpointer` alone. Submodules: format (names, marker,
find_checkpoint, rotation), state (capture off the device, RNG), checkpointer (the face), parts (the registry
of stateful parts and their contract), write / load (folders on disk), safe_load (the restricted unpickler),
remote (the bucket side), resume (rank 0 decides where a run resumes), saver / uploader (the saver thread),
partials (crashes' leftovers), upload_report (the closing word on the bucket). Import what you use from its
submodule: a tool that needs only the format (utils/push_checkpoint.py) then does not pay for importing torch.
"""
