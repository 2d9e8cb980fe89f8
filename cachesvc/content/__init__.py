"""Content: blobs and packs over the byte store (filled in by the next commit)."""
