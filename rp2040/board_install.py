# Runs ON THE BOARD (MicroPython), sent by rp2040/flash.py with `mpremote run` after `ARGS = {...}`; never
# copied to flash. It makes a flash atomic: rp2040.flash copies every file under STAGE, then "commit" checks
# each staged file's size and sha256 and only then moves the old install aside and the new one into place,
# the model last. A reset before that leaves the old install whole (STAGE is cleared by the next flash); a
# reset inside the swap leaves no /model at worst, which main.py reports in one line. Never a half-copied model.
#
# ARGS["do"]:
#   "probe":   print "@@ have PATH SIZE SHA256" for each file of the current install (ARGS["replace"]), then
#              "@@ space FREE BLOCK OLD": free bytes, the block size, and the bytes that the current install
#              and the leftovers of an interrupted flash hold, whole blocks counted.
#   "prepare": remove those leftovers (and the current install too when ARGS["clear"]: the new one fits only
#              without it), then make ARGS["dirs"] under STAGE.
#   "commit":  check ARGS["files"] {path: [size, sha256 hex]} under STAGE; with ARGS["raw"] ({"path", "size",
#              "sha256", "offset", "end"}) write that staged file into the raw flash region [offset, end) before
#              littlefs (rp2.Flash's blocks before its first), check it there by sha256 and drop it from STAGE;
#              then move the unchanged files ARGS["keep"] from the current install into STAGE and swap
#              ARGS["replace"] in order. config.json, which names the raw model's CRC, moves in last: a reset
#              mid-write leaves a region that the old config.json does not match, refused by the runtime.
# Last line: "@@ ok", or "@@ error WHAT" with nothing moved.
import binascii
import hashlib
import os

STAGE = "/.piconeox-new"
OLD = "/.piconeox-old"
IS_DIR = 0x4000


def entry(path):
    """(type, size) of `path`, or None; from its folder's listing (each os.stat costs a littlefs walk too)."""
    folder, name = path.rsplit("/", 1)
    try:
        for e in os.ilistdir(folder or "/"):
            if e[0] == name:
                return e[1], e[3]
    except OSError:  # no such folder
        pass
    return None


def exists(path):
    return path == "/" or entry(path) is not None


def walk(path):
    """(path, size) of each file under `path` (itself, if a file); folders listed once each."""
    found = entry(path)
    if found is None:
        return
    if found[0] != IS_DIR:
        yield path, found[1]
        return
    for name, kind, _, size in sorted(os.ilistdir(path)):
        if kind == IS_DIR:
            yield from walk(path + "/" + name)
        else:
            yield path + "/" + name, size


def remove(path):
    found = entry(path)
    if found is None:
        return
    if found[0] == IS_DIR:
        for e in list(os.ilistdir(path)):
            remove(path + "/" + e[0])
        os.rmdir(path)
    else:
        os.remove(path)


def held(path, block):
    """Flash bytes under `path`: whole blocks per file (a folder's two are left out: the margin covers them)."""
    return sum(-(-size // block) * block for _, size in walk(path))


def makedirs(path):
    at = ""
    for part in path.strip("/").split("/"):
        at += "/" + part
        if not exists(at):
            os.mkdir(at)


def sha256(path):
    h, buf = hashlib.sha256(), bytearray(1024)
    with open(path, "rb") as f:
        while True:
            n = f.readinto(buf)
            if not n:
                return binascii.hexlify(h.digest()).decode()
            h.update(memoryview(buf)[:n])


def probe():
    for p in ARGS["replace"]:  # noqa: F821  (typed in before this file)
        for f, size in walk(p):
            print("@@ have", f, size, sha256(f))
    s = os.statvfs("/")
    old = sum(held(p, s[0]) for p in ARGS["replace"] + [STAGE, OLD])  # noqa: F821
    print("@@ space", s[0] * s[3], s[0], old)


def prepare():
    remove(STAGE)
    remove(OLD)
    if ARGS["clear"]:  # noqa: F821
        for p in ARGS["replace"]:  # noqa: F821
            remove(p)
    for d in ARGS["dirs"]:  # noqa: F821
        makedirs(STAGE + d)


def mismatch():
    staged = dict(walk(STAGE))
    for path, (size, digest) in ARGS["files"].items():  # noqa: F821
        if STAGE + path not in staged:
            return path + " did not arrive"
        if staged[STAGE + path] != size:
            return "%s arrived with %d bytes instead of %d" % (path, staged[STAGE + path], size)
        if sha256(STAGE + path) != digest:
            return path + " arrived with other bytes (sha256 differs)"
    return None


def write_raw(raw):
    """Write the staged file raw["path"] into flash [raw["offset"], raw["end"]) and check it; None or why not."""
    import rp2

    flash, buf = rp2.Flash(), bytearray(4096)
    first = (raw["offset"] - raw["end"]) // 4096  # a negative block number: before littlefs's first block
    flash.readblocks(first, buf)
    if bytes(buf[:4]) not in (b"\xff\xff\xff\xff", b"PNXM"):  # a larger firmware reaches it: never overwrite
        return "flash at 0x%x holds neither a model nor erased flash (a larger firmware?): not written" % raw["offset"]
    blocks = -(-raw["size"] // 4096)
    with open(STAGE + raw["path"], "rb") as f:
        for i in range(blocks):
            n = f.readinto(buf)
            for j in range(n, 4096):
                buf[j] = 0xFF
            flash.ioctl(6, first + i)  # erase, then program
            flash.writeblocks(first + i, buf)
    h, left = hashlib.sha256(), raw["size"]
    for i in range(blocks):
        flash.readblocks(first + i, buf)
        h.update(memoryview(buf)[:min(left, 4096)])
        left -= 4096
    if binascii.hexlify(h.digest()).decode() != raw["sha256"]:
        return "the raw flash region read back other bytes than %s (sha256 differs)" % raw["path"]
    os.remove(STAGE + raw["path"])
    return None


def commit():
    for p in ARGS["keep"]:  # noqa: F821
        makedirs(STAGE + p.rsplit("/", 1)[0])
        os.rename(p, STAGE + p)
    for p in ARGS["replace"]:  # noqa: F821  (the model last)
        if exists(p):
            makedirs(OLD + p.rsplit("/", 1)[0])
            os.rename(p, OLD + p)
        if exists(STAGE + p):
            makedirs(p.rsplit("/", 1)[0] or "/")
            os.rename(STAGE + p, p)
    remove(OLD)
    remove(STAGE)


def main():
    do = ARGS["do"]  # noqa: F821
    if do == "probe":
        probe()
    elif do == "prepare":
        prepare()
    else:
        bad = mismatch() or (write_raw(ARGS["raw"]) if ARGS.get("raw") else None)  # noqa: F821
        if bad:
            print("@@ error", bad)
            return
        commit()
    print("@@ ok")


main()
