#!/usr/bin/env bash
# Run pip ("$@" is the pip command line) without one known-harmless line. A machine whose pip
# configuration lists local file:// indexes (see `pip config list`: global.extra-index-url) gets
#   WARNING: Location 'file:///.../simple/<name>/' is ignored: it is neither a file nor a directory.
# for every package such an index does not carry: one line per package, nothing wrong. Everything
# else pip prints (errors, every other warning) passes through, and pip's exit status is kept.
"$@" 2>&1 | grep -v -E "^WARNING: Location 'file://[^']*' is ignored: it is neither a file nor a directory\.$"
exit "${PIPESTATUS[0]}"
