"""Publish, beside ``restore/``: a process's compile state to the service, as a version of a key.

    snapshot   the directory snapshot (kind inductor-dir): walk the roots, encode and pack the blobs, ask
               the service which it lacks, upload those, sign and commit the manifest (``publish``), with
               the admission rule (``admit``)
    keying     the settings of the publishing process that key its state apart (``keying_warnings``)
    onefile    a one-file kind (mega-cache, aot-function, pt2-package): the file staged alone and published
               through ``snapshot.publish`` (``publish_file``); making the file is ``cachesvc_client.onefile``

The door for callers is ``CacheClient.publish``, ``publish_mega_cache`` and ``publish_precompiled``; this
``__init__`` imports nothing.
"""
