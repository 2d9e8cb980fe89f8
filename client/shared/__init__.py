"""The rules the client and the service share: standard library only, so the service (and an init
container without torch) can import them at no cost.

    keys      the cache key, names, shapes, tags, kinds and paths, and their checks
    rules     the error codes, the encodings and the decoder's bounds both sides enforce
    signing   the signed manifest (Ed25519 over ``manifest_bytes``) and its checks
    units     sizes as people type them (``500G``) and as the reports print them

The door is each module itself (``from cachesvc_client.shared import keys``). This ``__init__`` imports
nothing: ``import cachesvc_client.shared.keys`` loads keys and nothing else of the client.
"""
