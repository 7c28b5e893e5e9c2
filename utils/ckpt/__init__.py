"""Checkpoints: the format and its COMPLETE marker, capture, write, load, resume, the saver thread, and three
sub-rooms: `untrusted/` (loading bytes someone else wrote; its one door is `untrusted.safe_load`), `bucket/` (a
bucket's steps, crashes' leftovers, the closing word on an upload) and `hf/` (HF model folders).

Other rooms come in through three doors (docs/house.yaml): `checkpointer.Checkpointer` (all train.py touches),
`read` (every reader of a checkpoint: a model and tokenizer from a run, a step, an HF folder or a bucket URL) and
`write` (utils.consolidate). Inside: format (names, marker, find_checkpoint, rotation; the floor below the other
checkpoint rooms), state (capture off the device, RNG), parts (the registry of stateful parts and their contract),
write / load (folders on disk), resume (rank 0 decides where a run resumes), saver / uploader / save_request (the
saver thread). Import what you use from its submodule: a tool that needs only the format (utils/push_checkpoint.py)
then does not pay for importing torch.
"""
