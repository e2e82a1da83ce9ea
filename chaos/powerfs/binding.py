"""The FUSE binding: mfusepy (ctypes, no compiling), loaded against libfuse3 only.

mfusepy looks for libfuse2 first when no library is named; powerfs is written against the
libfuse3 API (rename flags, the config struct, `fuse_invalidate_path`), so the library is named
here before mfusepy is imported. Import `mfusepy` from this module, never directly.
Needs Debian's `fuse3` (fusermount3) and `libfuse3-3`; the import raises OSError without them.
"""

import os

os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")

import mfusepy

__all__ = ["mfusepy"]
