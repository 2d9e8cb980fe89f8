"""The byte codec: how a file becomes stored bytes at publish and stored bytes become a file again.

    encoding   hashing files; identity or zstd per blob (``encode``), ``file_sha256``
    decoding   bounded decoding: every stored byte the client decodes goes through here
    frames     large blobs as independent zstd frames, decoded on several threads
    packing    packs of small blobs: built at publish, members read back at restore

No HTTP (that is ``transport/``) and no torch. The door is each module (``from ..codec import encoding``);
this ``__init__`` imports nothing, so a module that needs one codec step pays for no other.
"""
