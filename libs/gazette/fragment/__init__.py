"""Fragments of journals: naming, codecs, the fragment index, and BLOB stores."""
