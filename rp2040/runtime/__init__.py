"""The piconeox RP2040 runtime: MicroPython code that also runs unchanged under CPython.

On a board this package lives at /lib/piconeox/ (see rp2040/flash.py); on the host it is
`rp2040.runtime`. Modules import each other relatively so the package name does not matter.
Only `array`, `struct`, `math` and `gc` are used (`binascii` when present, for the checksum).
"""
