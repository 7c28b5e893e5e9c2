"""Checkpoints: the format and its COMPLETE marker, capture, write, load, resume, the saver thread, and three
sub-rooms: `untrusted/` (loading bytes someone else wrote; its one door is `untrusted.safe_load`), `bucket/` (a
bucket's steps, crashes' leftovers, the closing word on an upload) and `hf/` (HF model folders).

train.py talks to this room through `checkpointer.Checkpointer` alone. Submodules: format (names, marker,
find_checkpoint, rotation), state (capture off the device, RNG), checkpointer (the face), parts (the registry
of stateful parts and their contract), write / load (folders on disk), resume (rank 0 decides where a run
resumes), saver / uploader (the saver thread). Import what you use from its submodule: a tool that needs only
the format (utils/push_checkpoint.py) then does not pay for importing torch.
"""
