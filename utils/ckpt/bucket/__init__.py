"""The bucket side of checkpoints: a bucket's steps (`remote`), crashes' leftovers (`partials`), the closing word
on an upload (`upload_report`)."""
